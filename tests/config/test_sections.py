"""The sections of a run's config: each field's default, and the data section's kind."""
from lmkit.config import SECTIONS, sections
from lmkit.config.sections import DataConfig


def test_every_section_has_its_name_and_the_defaults_a_run_starts_from():
    classes = [getattr(sections, name) for name in sections.__all__]
    assert {cls.SECTION for cls in classes} | {"model"} == set(SECTIONS)
    assert (sections.ComputeConfig().precision, sections.DistributionConfig().backend,
            sections.CheckpointConfig().keep_checkpoints) == ("float32", "auto", 3)
    assert (sections.AdapterConfig().lora_rank, sections.RunConfig().seed) == (0, 1234)


def test_the_data_section_compares_and_prints_as_its_kind():
    data = DataConfig(batch_size=4, num_steps=5, kind="text", train_file="t.txt")
    assert data == "text" and data != "ptb" and str(data) == "text" and data.kind == "text"
    assert data == DataConfig(batch_size=4, num_steps=5, kind="text", train_file="t.txt")
    assert data != DataConfig(batch_size=8, num_steps=5, kind="text", train_file="t.txt")
