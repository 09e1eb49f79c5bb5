"""A Secret the pods read but that is not there fails the experiment in Pending, before any GPU is
used (issue 16): which Secrets are needed, what the message says, and what decide() does with it."""

from __future__ import annotations

from datetime import UTC, datetime

from specdecode.experiment import children, reconcile, secretrefs, validation
from specdecode.experiment.reconcile import Action, Observed
from specdecode.experiment.status import ExperimentStatus, Phase
from tests.factories import experiment_document

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
API_KEY = {"apiKeySecret": {"name": "vllm-key", "key": "api-key"}}
S3 = children.Settings(results_env={"SPECDECODE_RESULTS_S3_BUCKET": "b"}, results_secret="s3-keys")


def subject(**engine: object) -> reconcile.Subject:
    parsed, name = validation.parse_experiment(experiment_document(engine={"image": "vllm/x:1", **engine}))
    return reconcile.Subject(name=name, generation=1, spec=parsed)


def seen(
    s: reconcile.Subject, found: dict[str, frozenset[str] | None], settings: children.Settings
) -> Observed:
    """What the shell observes in namespace llm, given each Secret's key names (None: absent)."""
    assert s.spec is not None
    needs = secretrefs.needed(s.spec, settings)
    return Observed(secrets=tuple(secretrefs.Seen(n, "llm", found[n.secret]) for n in needs))


def pending() -> ExperimentStatus:
    return ExperimentStatus(observed_generation=1, phase=Phase.PENDING, phase_started_at=T0.isoformat())


def test_the_secrets_needed_are_those_the_arms_and_the_load_job_reference() -> None:
    s = subject(**API_KEY, hfTokenSecret={"name": "hf", "key": "token"})
    assert s.spec is not None
    needs = secretrefs.needed(s.spec, S3)
    assert [(n.field.split(" (")[0], n.secret, n.keys) for n in needs] == [
        ("spec.engine.apiKeySecret", "vllm-key", ("api-key",)),
        ("spec.engine.hfTokenSecret", "hf", ("token",)),
        ("the operator's S3 results store", "s3-keys", ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")),
    ]


def test_no_secret_is_needed_without_an_api_key_a_token_or_an_s3_store() -> None:
    s = subject()
    assert s.spec is not None
    assert secretrefs.needed(s.spec, children.Settings()) == []
    # The credentials Secret without an S3 store is not referenced by the load Job: not needed.
    assert secretrefs.needed(s.spec, children.Settings(results_secret="s3-keys")) == []


def test_a_missing_api_key_secret_fails_pending_at_once_and_deploys_nothing() -> None:
    s = subject(**API_KEY)
    decision = reconcile.decide(s, pending(), seen(s, {"vllm-key": None}, children.Settings()), T0)
    assert (decision.status.phase, decision.status.reason) == (Phase.FAILED, "SecretMissing")
    assert Action.CREATE_ARMS not in decision.actions
    assert decision.actions == []
    assert decision.status.verdict is None
    message = decision.status.message or ""
    for phrase in (
        "spec.engine.apiKeySecret names Secret vllm-key, which does not exist in namespace llm",
        "both arms and the load Job read it",
        "kubectl create secret generic vllm-key -n llm --from-literal=api-key=...",
    ):
        assert phrase in message, message
    assert [e.reason for e in decision.events] == ["SecretMissing"]


def test_a_missing_key_is_named_with_the_keys_the_secret_has() -> None:
    s = subject(**API_KEY)
    observed = seen(s, {"vllm-key": frozenset({"apikey"})}, children.Settings())
    decision = reconcile.decide(s, pending(), observed, T0)
    assert decision.status.reason == "SecretMissing"
    message = decision.status.message or ""
    assert "spec.engine.apiKeySecret: Secret vllm-key in namespace llm has no key api-key" in message
    assert "its keys: apikey" in message
    assert "kubectl edit secret vllm-key -n llm" in message


def test_the_s3_credentials_secret_is_named_by_its_chart_value_with_both_keys() -> None:
    s = subject()
    decision = reconcile.decide(s, pending(), seen(s, {"s3-keys": None}, S3), T0)
    assert decision.status.reason == "SecretMissing"
    message = decision.status.message or ""
    assert "resultsStore.s3.credentialsSecret" in message
    assert "--from-literal=AWS_ACCESS_KEY_ID=... --from-literal=AWS_SECRET_ACCESS_KEY=..." in message, message
    assert "name an existing Secret" not in message  # the chart's to change, not the spec's
    half = reconcile.decide(s, pending(), seen(s, {"s3-keys": frozenset({"AWS_ACCESS_KEY_ID"})}, S3), T0)
    assert "has no key AWS_SECRET_ACCESS_KEY" in (half.status.message or "")


def test_every_missing_secret_is_named_at_once() -> None:
    s = subject(**API_KEY, hfTokenSecret={"name": "hf", "key": "token"})
    observed = seen(s, {"vllm-key": None, "hf": frozenset()}, children.Settings())
    message = reconcile.decide(s, pending(), observed, T0).status.message or ""
    assert "Secret vllm-key, which does not exist" in message
    assert "Secret hf in namespace llm has no key token" in message
    assert "its keys: none" in message


def test_secrets_that_are_there_with_their_keys_deploy_as_before() -> None:
    s = subject(**API_KEY)
    observed = seen(s, {"vllm-key": frozenset({"api-key", "other"})}, children.Settings())
    decision = reconcile.decide(s, pending(), observed, T0)
    assert decision.status.phase is Phase.DEPLOYING
    assert decision.actions == [Action.CREATE_ARMS]


def test_secrets_not_checked_deploy_as_before() -> None:
    """The operator may not read Secrets (403): nothing observed, the pods' errors remain the check."""
    decision = reconcile.decide(subject(**API_KEY), pending(), Observed(), T0)
    assert decision.status.phase is Phase.DEPLOYING
    assert decision.actions == [Action.CREATE_ARMS]
