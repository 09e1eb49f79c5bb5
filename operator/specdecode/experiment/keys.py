"""The names of our API and every label and annotation key, each spelled once.

The operator, the load Job, `run --local`, the kubectl plugin and the CRD generator all name the
resource and the keys on its children through this module, so a key cannot drift between the side
that writes it and the side that reads it. The keys of others that we set on our children, or read
from them, are here too, each with who owns it (the labels of nodes that describe their hardware
are read in `controller/observe.py`, next to the code that reads them).

The resource (`crds/specdecodeexperiments.specdecode.io.yaml`, `specdecode.experiment.crd`):

- `API_GROUP`, `API_VERSION`, `KIND`, `PLURAL`, `SHORT_NAME`; `GROUP_VERSION` is the `apiVersion`
  written on an experiment (and in the owner references to it).
- `FINALIZER` and kopf's annotation prefix (`API_GROUP`) are set in `controller/handlers.py: configure`.

Labels (`specdecode.io/...`):

- `LABEL_EXPERIMENT` (`specdecode.io/experiment`): the experiment a child belongs to; on every child
  and pod. Prometheus keeps it as `specdecode_io_experiment` (the chart's scrape config), the
  operator's selector for one experiment's children.
- `LABEL_ARM` (`specdecode.io/arm`): `control` or `treatment`, on an arm's Deployment, pods and
  Service; Prometheus keeps it as `specdecode_io_arm`.
- `LABEL_RESULTS` (`specdecode.io/results`): on the load Job's results ConfigMaps, the experiment
  they were written for (for people and `kubectl specdecode watch`; the operator trusts it for
  nothing, see `specdecode.results`).

Annotations (`specdecode.io/...`):

- `GENERATION_ANNOTATION` (`specdecode.io/generation`): on every child, the experiment's
  `metadata.generation` it was built for (a spec edit renders new children).
- `ROUND_ANNOTATION` (`specdecode.io/round`): on an arm's Deployment and pod template, the round it
  was rendered for (`rounds.py`; absent: the stages).
- `ABORT_ANNOTATION` (`specdecode.io/abort`): on the experiment, set by `kubectl specdecode abort` to
  the generation to end now (Failed, reason Aborted).
- `PART_ANNOTATION` (`specdecode.io/part`): on a results ConfigMap, its place `i/N` in the bundle.
- `DIGEST_ANNOTATION` (`specdecode.io/bundle-digest`): on every results ConfigMap of one upload, the
  sha256 of the whole bundle.
- `LOAD_POD_ANNOTATION` (`specdecode.io/load-pod`): on a results ConfigMap of a load Job of more
  than one pod (`spec.workload.loadPods`), the pod `k/N` whose bundle it belongs to.

Keys of others:

- `LABEL_MANAGED_BY`, `LABEL_COMPONENT`: Kubernetes' recommended `app.kubernetes.io/...` labels,
  set on every child (`manifests.labels`).
- `JOB_UID_LABEL`, `JOB_NAME_LABEL`: set by the Job controller on a Job's pods (Kubernetes >= 1.27);
  the load pod learns its Job from them (downward API), the operator reads the name.
- `JOB_COMPLETION_INDEX_ENV`: set by the Job controller in each pod of an Indexed Job, its index
  (the load pod's shard, `spec.workload.loadPods`).
"""

from __future__ import annotations

API_GROUP = "specdecode.io"
API_VERSION = "v1alpha1"
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"
KIND = "SpecDecodeExperiment"
PLURAL = "specdecodeexperiments"
SHORT_NAME = "sdx"
FINALIZER = f"{API_GROUP}/finalizer"

LABEL_EXPERIMENT = f"{API_GROUP}/experiment"
LABEL_ARM = f"{API_GROUP}/arm"
LABEL_RESULTS = f"{API_GROUP}/results"

GENERATION_ANNOTATION = f"{API_GROUP}/generation"
ROUND_ANNOTATION = f"{API_GROUP}/round"
ABORT_ANNOTATION = f"{API_GROUP}/abort"
PART_ANNOTATION = f"{API_GROUP}/part"
DIGEST_ANNOTATION = f"{API_GROUP}/bundle-digest"
LOAD_POD_ANNOTATION = f"{API_GROUP}/load-pod"

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
JOB_COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"
