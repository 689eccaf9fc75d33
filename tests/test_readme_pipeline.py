"""The README's pipeline table is the pipeline that runs (`stages_for`)."""

from pathlib import Path

from scanweaver.rewrites.pipeline import TARGETS, pipeline_table, stages_for

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_pipeline_table_matches_stages_for():
    text = README.read_text()
    begin, end = "<!-- pipeline-table:begin -->", "<!-- pipeline-table:end -->"
    assert begin in text and end in text, "README lost its generated pipeline table"
    documented = text.split(begin, 1)[1].split(end, 1)[0].strip()
    assert documented == pipeline_table(), (
        "README pipeline table is stale: regenerate with "
        "`python -m scanweaver.rewrites.pipeline`"
    )


def test_table_names_every_stage_of_every_target():
    table = pipeline_table()
    for target in TARGETS:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{target}`"))
        assert [s.strip(" `") for s in row.split("|")[2].split("→")] == [
            stage.name for stage in stages_for(target)
        ]
