"""``lmkit download``'s own checks (the downloads themselves are tests/data/test_corpora.py's)."""
import pytest

from lmkit.cli import download
from lmkit.core.errors import UsageError


def test_list_names_every_corpus(capsys):
    from lmkit.data.corpora import CORPORA
    assert download.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ptb ") and all(f"\n{name} " in out for name in CORPORA)


@pytest.mark.parametrize("argv, message", [
    ([], r"name a corpus, e.g. `lmkit download wikitext-2`"),
    (["wikitext2"], r"unknown corpus 'wikitext2'; did you mean 'wikitext-2'"),
])
def test_a_missing_or_unknown_corpus_is_named(argv, message):
    with pytest.raises(UsageError, match=message):
        download.main(argv)
