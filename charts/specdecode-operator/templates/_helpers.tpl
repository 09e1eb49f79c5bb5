{{/* Chart name, overridable. */}}
{{- define "specdecode-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's resources (63 characters at most: some fields are DNS labels). */}}
{{- define "specdecode-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The labels that select the operator's pod. Each experiment's NetworkPolicy admits pods labelled
app.kubernetes.io/name=specdecode-operator to the arms: keep nameOverride empty. */}}
{{- define "specdecode-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specdecode-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every resource of the chart. */}}
{{- define "specdecode-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "specdecode-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: specdecode-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels of the PodMonitors: the chart's, plus monitoring.podMonitor.labels (a Prometheus's podMonitorSelector). */}}
{{- define "specdecode-operator.podMonitorLabels" -}}
{{ include "specdecode-operator.labels" . }}
{{- with .Values.monitoring.podMonitor.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "specdecode-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "specdecode-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* A label map as "k1=v1,k2=v2" (how controller/settings.py reads label variables). */}}
{{- define "specdecode-operator.labelList" -}}
{{- $pairs := list }}
{{- range $key, $value := . }}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/* The image reference: repository@digest, else repository:tag (tag defaults to appVersion). */}}
{{- define "specdecode-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
RBAC, in two groups (kopf docs/deployment-rbac.yaml):
- Framework: what kopf itself needs to serve the SpecDecodeExperiment resource.
- Application: what the controller creates and reads in the experiments' namespaces.
"namespacedRules" hold in every served namespace: in the ClusterRole when all namespaces are
served, else in one Role per namespace. "clusterRules" are cluster-scoped and always in the ClusterRole.
Verbs are exactly those used; no wildcards (tests/chart/test_chart.py checks the table).
*/}}
{{- define "specdecode-operator.namespacedRules" -}}
# Framework: watching the experiments, adding kopf's finalizer (patch) and writing .status.
- apiGroups: [specdecode.io]
  resources: [specdecodeexperiments]
  verbs: [get, list, watch, patch]
- apiGroups: [specdecode.io]
  resources: [specdecodeexperiments/status]
  verbs: [get, patch]
# Framework: children are adopted with blockOwnerDeletion, which clusters with the
# OwnerReferencesPermissionEnforcement admission plugin (e.g. OpenShift) allow only to whoever may
# update the owner's finalizers.
- apiGroups: [specdecode.io]
  resources: [specdecodeexperiments/finalizers]
  verbs: [update]
# Framework: posting Events (kopf.info/warn and per-object log lines) about the experiments.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# Application: the children of an experiment: both arms (Deployment, Service), the NetworkPolicy
# around them, and the load Job with its ServiceAccount, Role and RoleBinding. Created if absent,
# read back, listed by label and deleted by the cleanup policy (controller/kube.py); never patched.
# Deployments are also replaced (update) once per round after the stages: the crossover pins each arm
# to the other's node, the confirmation renders the treatment with its schedule (experiment/rounds.py).
- apiGroups: [apps]
  resources: [deployments]
  verbs: [create, get, list, update, delete]
# Jobs are also watched: a load Job that ends wakes its experiment's tick at once, so the results
# are judged then, not up to an interval later (controller/ticks.py, handlers.wake_on_load_job).
- apiGroups: [batch]
  resources: [jobs]
  verbs: [create, get, list, watch, delete]
- apiGroups: [""]
  resources: [services, serviceaccounts]
  verbs: [create, get, list, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create, get, list, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [create, get, list, delete]
# Application: the arms' PodDisruptionBudget, created with them and deleted when the experiment
# ends; never listed (it has one name per experiment).
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [create, get, delete]
# Application: ConfigMaps: the spec ConfigMap, the load Job's result chunks (read by name; listed
# for their metadata only) and the report (written with update). RBAC escalation prevention: the
# load Job's Role grants configmaps create/update, and only a holder of both may create that Role
# and bind it (without the escalate/bind verbs, which we do not want). Never patched.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create, get, list, update, delete]
# Application: failure detection: Unschedulable, ImagePullBackOff, CrashLoopBackOff and OOMKilled
# are read from the pods of the arms and the load Job.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list]
# Application: silent degradations (issue 18): the start of the treatment pod's log, read once when
# both arms are Ready, for the lines where vLLM says it weakened speculation. Only get; without it
# the SpeculationDegraded condition is never raised.
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
{{- if .Values.rbac.readSecrets }}
# Application: missing Secrets (issue 16): before creating the arms, the Secrets their pods and the
# load Job read (spec.engine.apiKeySecret, hfTokenSecret, resultsStore.s3.credentialsSecret) are read
# by name for the names of their keys, so that one missing fails the experiment before any GPU is used
# (values are never logged or kept). Only get: Secrets are never listed or watched. Without it
# (rbac.readSecrets: false) the check is skipped and a missing Secret shows as a pod stuck in
# CreateContainerConfigError.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
{{- end }}

{{- define "specdecode-operator.clusterRules" -}}
# Framework: kopf's cluster scanning notices the CRD being (re)installed or removed.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
# Application: provenance (issue 22): the GPU product, driver, CUDA, CPU and instance-type labels
# and the CPU capacity of the Nodes the arms run on, read once when both arms are Ready. Only get,
# by name: Nodes are never listed, watched or changed. Without it the arms' hosts go unrecorded.
- apiGroups: [""]
  resources: [nodes]
  verbs: [get]
{{- if .Values.watchNamespaces }}
# Framework: when serving a list of namespaces, kopf lists and watches Namespaces to notice them
# appearing and disappearing (it does not when serving all namespaces).
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
{{- end }}
