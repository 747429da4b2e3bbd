"""A folder that Hugging Face ``datasets`` wrote with ``save_to_disk``: the text in ``--text_column``.

Read with ``datasets.load_from_disk`` (optional: ``pip install
"lmkit[data]"``), which maps the Arrow files without reading them into
memory; the text column is read in batches of
:data:`~lmkit.data.formats.arrow.BATCH_ROWS` rows. A ``DatasetDict`` folder
(several splits) gives the split of the file it is named for: ``train`` for
``--train_file``, ``validation`` for ``--valid_file``, ``test`` for
``--test_file`` (:attr:`~lmkit.data.formats.base.Source.dataset_split`); a split's
own folder (``corpus/validation``) may be named instead.
"""

from __future__ import annotations

import os
from typing import BinaryIO, Callable, Dict, Iterator, List, Tuple

from lmkit.data.errors import DataError
from lmkit.data.formats.arrow import BATCH_ROWS, check_text_column, column_texts
from lmkit.data.formats.base import RecordText, Source, TableFormat, buffered, import_library, lines_of

__all__ = ["SavedDataset", "is_dataset_folder", "is_dataset_dict"]

# The files save_to_disk writes (datasets.config's DATASET_STATE_JSON_FILENAME, DATASET_INFO_FILENAME and
# DATASETDICT_JSON_FILENAME), looked for without importing datasets.
_DATASET_FILES = ("state.json", "dataset_info.json")
_DICT_FILE = "dataset_dict.json"


def is_dataset_dict(path: str) -> bool:
    """Whether ``path`` is a folder of ``DatasetDict.save_to_disk``."""
    return os.path.isfile(os.path.join(path, _DICT_FILE))


def is_dataset_folder(path: str) -> bool:
    """Whether ``path`` is a folder of ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    return is_dataset_dict(path) or all(os.path.isfile(os.path.join(path, f)) for f in _DATASET_FILES)


class SavedDataset(TableFormat):
    """A ``datasets`` folder (``Dataset`` or ``DatasetDict``, ``save_to_disk``)."""

    name = "datasets"
    kind = "a datasets folder"

    def options(self, source: Source) -> Dict[str, str]:
        options = {"text_column": source.text_column}
        if is_dataset_dict(source):
            options["split"] = source.dataset_split
        return options

    def files(self, source: Source) -> List[str]:
        """The files that hold the data read (a ``DatasetDict``'s: its split's folder when it has one)."""
        folder = os.fspath(source)
        if is_dataset_dict(folder) and os.path.isdir(os.path.join(folder, source.dataset_split)):
            folder = os.path.join(folder, source.dataset_split)
        return sorted(os.path.join(root, name) for root, _, names in os.walk(folder) for name in names)

    def open(self, source: Source, what: str) -> Tuple[BinaryIO, Callable[[], float]]:
        datasets = import_library("datasets", "datasets", source, what, f"{self.kind} (save_to_disk)")
        try:
            loaded = datasets.load_from_disk(os.fspath(source))
        except (OSError, ValueError, KeyError) as exc:
            raise DataError(f"{what} {os.fspath(source)!r} looks like a datasets folder but datasets.load_from_disk "
                            f"cannot read it ({exc}); write it again with save_to_disk") from None
        if isinstance(loaded, datasets.DatasetDict):
            loaded = _split(loaded, source, what)
        column = check_text_column(loaded.data.schema, source, what)
        rows = max(1, loaded.num_rows)
        read = [0]

        def texts() -> Iterator[Tuple[bytes, ...]]:
            import pyarrow as pa

            batches = loaded.select_columns([column]).with_format("arrow").iter(batch_size=BATCH_ROWS)
            yield from column_texts(batches, source, what, (pa.ArrowException, OSError),
                                    lambda n: read.__setitem__(0, n))

        return buffered(RecordText(lines_of(texts(), source))), lambda: read[0] / rows


def _split(loaded: Dict[str, object], source: Source, what: str) -> object:
    """The split of a DatasetDict that ``source`` names (train, validation or test)."""
    if source.dataset_split not in loaded:
        present = sorted(loaded)
        example = os.path.join(os.fspath(source), present[0] if present else "<split>")
        raise DataError(f"{what} {os.fspath(source)!r} is a DatasetDict folder with the splits "
                        f"{', '.join(present) or 'none'} and no {source.dataset_split!r} split, which {what} reads; "
                        f"name a split's own folder instead (e.g. {example})")
    return loaded[source.dataset_split]
