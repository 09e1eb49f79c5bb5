from __future__ import annotations

from pathlib import Path

import pytest

from specdecode.experiment import documents
from tests.factories import EXAMPLES


def test_the_required_examples_exist() -> None:
    kinds = set()
    for path in EXAMPLES:
        for experiment in documents.read_file(path).experiments:
            kinds.add(experiment.spec.speculative.method.value)
            if experiment.spec.engine.simulator is not None:
                kinds.add("simulator")
            kinds.add(experiment.spec.analysis.mode.value)
    assert {"draft_model", "ngram", "simulator", "NoiseFloor"} <= kinds


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_valid(path: Path) -> None:
    report = documents.read_file(path)
    assert report.problems == []
    assert report.experiments
