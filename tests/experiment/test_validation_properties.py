"""Random specs never crash validation: each either validates or yields field-named problems."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from specdecode.experiment import validation
from tests.factories import experiment_document

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10_000),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["ngram", "draft_model", "mtp", "all", "--port", "30m"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
field_names = st.sampled_from(
    [
        "method",
        "model",
        "numSpeculativeTokens",
        "promptLookupMin",
        "promptLookupMax",
        "draftTensorParallelSize",
        "extra",
        "stages",
        "rate",
        "concurrency",
        "name",
        "dataset",
        "type",
        "args",
        "simulator",
        "requireStages",
        "confidence",
        "minSpeedup",
        "guardrails",
        "sampling",
        "maxTokens",
        "engine",
        "workload",
        "analysis",
        "speculative",
        "deadlines",
        "deploy",
        "cleanup",
        "bogus",
    ]
)


def mutate(tree: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    if not isinstance(tree, dict):
        tree = {}
    tree = dict(tree)
    tree[path[0]] = mutate(tree.get(path[0]), path[1:], value)
    return tree


@settings(max_examples=300, deadline=None)
@given(mutations=st.lists(st.tuples(st.lists(field_names, min_size=1, max_size=3), values), max_size=5))
def test_random_specs_validate_or_name_their_fields(mutations: list[tuple[list[str], Any]]) -> None:
    document = experiment_document()
    spec = document["spec"]
    for path, value in mutations:
        spec = mutate(spec, path, value)
    document["spec"] = spec
    problems = validation.check_document(document)
    for problem in problems:
        assert problem.path.startswith(("spec", "metadata", "apiVersion", "kind")), problem
        assert problem.message
    if not problems:
        experiment, name = validation.parse_experiment(document)
        assert name == "exp"
        assert experiment.workload.stages


@settings(max_examples=100, deadline=None)
@given(document=values)
def test_arbitrary_documents_never_crash(document: Any) -> None:
    problems = validation.check_document(document)
    assert all(str(problem) for problem in problems)


@settings(max_examples=200, deadline=None)
@given(args=st.lists(st.text(alphabet="-_=abcdefghijklmnopqrstuvwxyz0123456789.", max_size=30), max_size=6))
def test_engine_args_never_crash_and_owned_flags_are_always_caught(args: list[str]) -> None:
    problems = validation.check_document(experiment_document(engine={"args": args}))
    flagged = {p.path for p in problems}
    for i, arg in enumerate(args):
        if validation.owned_flag(arg) is not None:
            assert f"spec.engine.args[{i}]" in flagged
