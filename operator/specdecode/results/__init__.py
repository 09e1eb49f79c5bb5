"""Carrying the load Job's result files to the operator through ConfigMaps (or an S3 bucket), and
trusting only those.

The Job writes `requests.jsonl`, `windows.json` and `loadgen-summary.json`; they are packed into one
bundle (the format below, `format.py`) and split over ConfigMaps `<exp>-results-<i>` (binaryData,
under the 1 MiB object limit; `configmaps.py`), or, when the operator is given a bucket, uploaded as
one object per load pod (`s3.py`; `stores.py` picks the store). `limits.py`: the errors, and the size
budget checked before anything is deployed.

The bundle's format, version 2 (`VERSION`; binaryData key `results.v2.npz`): a NumPy `.npz` archive
(zip, each member deflated) of typed columns, one row per request record, and a small JSON member
`header` (`{"format": "specdecode.io/results", "version": 2, "records": n, "windows": ...,
"summary": ...}`). Numbers are int64/float64 columns (`INT_NONE`, NaN: null); strings are
dictionary-coded (int32 codes into a JSON table, -1: null), so a stage, an arm or a text hash is
stored once; the stream's events are kept as the two numbers the analysis reads (`token_events`,
`stream_tokens`), the server's per-request `speculative_decoding` as its counters and histogram,
and the generated text only for the pairs whose outputs differ and a sample (`SAMPLE_PAIRS` a
stage). What it leaves out (every event's time, `server_metrics`, the other texts) stays in the
load pod's `requests.jsonl` and its log summary. NumPy rather than Arrow/Parquet: it is already a
dependency of the operator and the load image, a typed column is all the analysis needs, and
`np.load(allow_pickle=False)` reads nothing but arrays; pyarrow would add ~100 MB to both images
for features (nested types, predicate push-down) nothing here uses. Read back, the rows become
slotted `records.PackedRequest`s (~0.7 KB each where a parsed JSON record took ~35 KB): 100,000
records are judged in well under 300 MiB (benchmarks/scale/results_100k.py).

Version 1 (key `bundle.json.gz`: the three files as one gzip'd JSON object) is what load images
before version 2 write; the operator still reads it (an operator upgraded while an experiment's
load Job runs the older image), bounded as before. A bundle of a version this module does not know
is refused naming its version (`ResultsUnsupported`). Every part carries its place (`specdecode.io/part: i/N`), the generation measured
(`specdecode.io/generation`) and the sha256 of the whole bundle (`specdecode.io/bundle-digest`, the
same on every part of one upload), and is owned by the experiment (deleting it removes them) and by
the load Job that wrote it (the Job's uid comes to its pod through the downward API). A load Job
of N > 1 pods (`spec.workload.loadPods`) stores one bundle per pod, `<exp>-results-pod<k>-<i>`
(`pod_prefix`), each part also annotated with its pod (`specdecode.io/load-pod: k/N`); the operator
reads every pod's bundle this way and merges them (`experiment/loadpods.py`).

The load Job uploads (`upload`, from cli.py), the operator downloads and parses (`download`,
`parse`), `kubectl specdecode watch` unpacks what it lists: so this module reaches Kubernetes only
through `ConfigMaps`, the two calls of `controller.kube.Kube` it needs, and imports only the core.

The operator trusts labels for nothing. It reads exactly `<exp>-results-0` .. `-N-1`, one GET each,
so a ConfigMap of any other name is never read, and uses a part only when it is owned by this
generation's load Job (the uid the operator observed), annotated with this generation and its
place, and when the joined parts hash to their digest. What it reads is bounded: at most
`Limits.max_parts` parts of at most `PART_BYTES` each, one part in memory at a time, and a bundle
that inflates to more than `Limits.max_bytes` is refused while it is decompressed (a gzip bomb
costs no more than that).

Not stopped: someone who may update ConfigMaps in the namespace and read the Job's uid (the
built-in `edit` role, which may also exec into the load pod) can rewrite a part and its digest.
The verdict is as trustworthy as the namespace's editors (README, "Security").

Errors, each with the status reason it ends in (`reason`)::

    ResultsError
    ├── ResultsMissing     the load Job stored nothing, or not every part
    ├── ResultsUntrusted   a part not written by this generation's load Job
    ├── ResultsTooLarge    more parts, a bigger part or a bigger bundle than the operator reads
    ├── ResultsCorrupt     the parts do not hash, inflate or parse to one bundle
    ├── ResultsUnsupported a bundle format newer than this operator reads
    └── s3.ResultsStoreError the S3 bucket cannot be used as configured (reason ResultsStoreFailed)
"""

from specdecode.results.configmaps import (
    CONFIG_MAP,
    ConfigMaps,
    build_config_maps,
    part_data,
    pod_prefix,
    upload,
)
from specdecode.results.format import (
    DATA_KEY,
    DATA_KEYS,
    FILES,
    FORMAT,
    GZIP_MAGIC,
    INT_NONE,
    LEGACY_DATA_KEY,
    VERSION,
    Bundle,
    Results,
    digest,
    encode,
    encode_dir,
    encode_files,
    pack,
    pack_legacy,
    parse,
    parse_files,
    read_dir,
    split,
    unpack,
    unpack_files,
)
from specdecode.results.limits import (
    CONFIG_MAP_MAX_BYTES,
    PART_BYTES,
    RECORD_BYTES,
    SAMPLE_PAIRS,
    TOKEN_BYTES,
    Limits,
    ResultsCorrupt,
    ResultsError,
    ResultsMissing,
    ResultsTooLarge,
    ResultsUnsupported,
    ResultsUntrusted,
    check_size,
    planned_bytes,
)
from specdecode.results.stores import download, objects_url

__all__ = [
    "CONFIG_MAP",
    "CONFIG_MAP_MAX_BYTES",
    "DATA_KEY",
    "DATA_KEYS",
    "FILES",
    "FORMAT",
    "GZIP_MAGIC",
    "INT_NONE",
    "LEGACY_DATA_KEY",
    "PART_BYTES",
    "RECORD_BYTES",
    "SAMPLE_PAIRS",
    "TOKEN_BYTES",
    "VERSION",
    "Bundle",
    "ConfigMaps",
    "Limits",
    "Results",
    "ResultsCorrupt",
    "ResultsError",
    "ResultsMissing",
    "ResultsTooLarge",
    "ResultsUnsupported",
    "ResultsUntrusted",
    "build_config_maps",
    "check_size",
    "digest",
    "download",
    "encode",
    "encode_dir",
    "encode_files",
    "objects_url",
    "pack",
    "pack_legacy",
    "parse",
    "parse_files",
    "part_data",
    "planned_bytes",
    "pod_prefix",
    "read_dir",
    "split",
    "unpack",
    "unpack_files",
    "upload",
]  # fmt: skip
