{{/* Names, labels and the settings every part derives from core.inferenceResources. */}}

{{- define "tmi.labels" -}}
app.kubernetes.io/part-of: kamiwaza-tenant-inference
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The tmi image, relocated like the platform's own images, a digest winning over the tag. */}}
{{- define "tmi.image" -}}
{{- $repo := .Values.image.repository -}}
{{- with .Values.global.imageRegistryPrefix -}}
{{- $repo = printf "%s/images/%s" (trimSuffix "/" .) (last (splitList "/" $.Values.image.repository)) -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo .Values.image.tag -}}
{{- end -}}
{{- end -}}

{{/* The tenant namespace: the tenant release's own, or the one the owner release names. */}}
{{- define "tmi.tenantNamespace" -}}
{{- if .Values.tenant.enabled -}}{{ .Release.Namespace }}{{- else -}}{{ .Values.owner.tenantNamespace }}{{- end -}}
{{- end -}}

{{/*
Every tenant namespace the owner release serves, as a JSON array: first the one above with
core.inferenceResources, then each of owner.tenants, whose absent fields are the first's. Each
entry: namespace, suffix ("" for the first, whose objects keep the single-tenant names, else
"-<namespace>"), the trust and profile settings, and where its webhook is called.
*/}}
{{- define "tmi.ownerTenants" -}}
{{- $ir := .Values.core.inferenceResources -}}
{{- $o := .Values.owner -}}
{{- $first := dict "namespace" (include "tmi.tenantNamespace" .) "suffix" "" "bundleConfigMap" $ir.bundleConfigMap "followRevisions" $ir.followRevisions "ownerPublicKey" $ir.ownerPublicKey "clusterBindingId" $ir.clusterBindingId "minimumBundleVersion" ($ir.minimumBundleVersion | int) "gpuRecipeCatalogConfigMap" ($ir.gpuRecipeCatalogConfigMap | default "") "cpuRecipeCatalogConfigMap" ($ir.cpuRecipeCatalogConfigMap | default "") "webhookUrl" $o.webhook.url "caBundle" $o.webhook.caBundle "priorityClasses" ($o.priorityClasses | default list) "quota" ($o.quota | default dict) -}}
{{- $all := list $first -}}
{{- range $o.tenants -}}
{{- $t := merge (dict "namespace" .namespace "suffix" (printf "-%s" .namespace) "webhookUrl" ((.webhook | default dict).url | default "") "caBundle" ((.webhook | default dict).caBundle | default "")) (omit . "webhook") (omit $first "namespace" "suffix" "webhookUrl" "caBundle" "priorityClasses" "quota") -}}
{{- $all = append $all $t -}}
{{- end -}}
{{- toJson $all -}}
{{- end -}}

{{/* The ConfigMaps an owner server reads by name in one tenant's namespace (`t`, an entry of
tmi.ownerTenants). */}}
{{- define "tmi.tenantConfigMaps" -}}
- {{ .bundleConfigMap | quote }}
{{- with .gpuRecipeCatalogConfigMap }}
- {{ . | quote }}
{{- end }}
{{- with .cpuRecipeCatalogConfigMap }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "tmi.pullSecret" -}}
{{- /* The seed: not defaulted when global.openshift.serviceAccountImagePullSecretsOnly is true
(pull credentials then come from the ServiceAccount alone). */ -}}
{{- if not ((.Values.global.openshift | default dict).serviceAccountImagePullSecretsOnly) -}}
{{- with .Values.global.imagePullSecrets -}}
{{- $first := first . -}}
{{- if kindIs "map" $first -}}{{ $first.name }}{{- else -}}{{ $first }}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The TMI_* settings both tenant servers read (envFrom), one ConfigMap so that the webhook and the
controller cannot disagree on trust, relocation or recipes.
*/}}
{{- define "tmi.policySettings" -}}
{{- $ir := .Values.core.inferenceResources -}}
TMI_ENABLED: {{ ternary "true" "false" $ir.enabled | quote }}
TMI_BUNDLE_CONFIGMAP: {{ required "core.inferenceResources.bundleConfigMap is required" $ir.bundleConfigMap | quote }}
{{- if $ir.followRevisions }}
TMI_FOLLOW_PROFILE_REVISIONS: "true"
{{- end }}
TMI_OWNER_PUBLIC_KEY: {{ required "core.inferenceResources.ownerPublicKey is required" $ir.ownerPublicKey | quote }}
TMI_CLUSTER_BINDING_ID: {{ required "core.inferenceResources.clusterBindingId is required" $ir.clusterBindingId | quote }}
TMI_MINIMUM_BUNDLE_VERSION: {{ $ir.minimumBundleVersion | int | toString | quote }}
{{- include "tmi.planningSettings" . }}
{{- include "tmi.revisionCaps" . }}
{{- end -}}

{{/*
What tenant data may cost each server that follows revisions (policy_io.caps): rendered only
when set, so the servers' own defaults hold otherwise.
*/}}
{{- define "tmi.revisionCaps" -}}
{{- $ir := .Values.core.inferenceResources -}}
{{- with $ir.maxProfileRevisions }}
TMI_MAX_PROFILE_REVISIONS: {{ . | int | toString | quote }}
{{- end }}
{{- with $ir.maxProfileRevisionBytes }}
TMI_MAX_PROFILE_REVISION_BYTES: {{ . | int | toString | quote }}
{{- end }}
{{- end -}}

{{/*
What a plan depends on besides the profile: the webhook plans with these, and the controller and
the owner's extender re-derive its plans with them.
*/}}
{{- define "tmi.planningSettings" -}}
{{- $ir := .Values.core.inferenceResources -}}
{{- with $ir.engineImageMap }}
TMI_ENGINE_IMAGE_MAP: {{ toJson . | quote }}
{{- end }}
{{- with .Values.global.imageRegistryPrefix }}
TMI_IMAGE_REGISTRY_PREFIX: {{ . | quote }}
{{- end }}
{{- with .Values.global.airgap.registry.url }}
TMI_AIRGAP_REGISTRY: {{ . | quote }}
{{- end }}
{{- with $ir.gpuRecipeCatalogConfigMap }}
TMI_GPU_RECIPE_CATALOG_CONFIGMAP: {{ . | quote }}
{{- end }}
{{- with $ir.cpuRecipeCatalogConfigMap }}
TMI_CPU_RECIPE_CATALOG_CONFIGMAP: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The ConfigMaps a tenant server reads by name: the profile and the pinned recipe catalogs. */}}
{{- define "tmi.namedConfigMaps" -}}
{{- $ir := .Values.core.inferenceResources -}}
- {{ $ir.bundleConfigMap | quote }}
{{- with $ir.gpuRecipeCatalogConfigMap }}
- {{ . | quote }}
{{- end }}
{{- with $ir.cpuRecipeCatalogConfigMap }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The two webhook entries' shared parts: where the API server calls, and what it sends. */}}
{{- define "tmi.webhookClientConfig" -}}
clientConfig:
  {{- if .url }}
  url: {{ .url | quote }}
  {{- else }}
  service:
    namespace: {{ .ns }}
    name: tmi-webhook
    path: /mutate
    port: 443
  {{- end }}
  {{- with .caBundle }}
  caBundle: {{ . | quote }}
  {{- end }}
{{- end }}
{{- define "tmi.webhookMatch" -}}
admissionReviewVersions: ["v1"]
sideEffects: None
failurePolicy: {{ .o.webhook.failurePolicy }}
matchPolicy: Equivalent
# Re-run after any later mutating webhook changes the Pod, so it is checked as stored.
reinvocationPolicy: IfNeeded
timeoutSeconds: {{ .o.webhook.timeoutSeconds }}
rules:
  - operations: ["CREATE", "UPDATE"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["pods", "pods/ephemeralcontainers"]
    scope: Namespaced
namespaceSelector:
  matchExpressions:
    - key: {{ .o.optInLabel }}
      operator: In
      values: ["enabled"]
    - key: kubernetes.io/metadata.name
      operator: In
      values: [{{ .ns | quote }}]
{{- end }}

{{/* Every tenant namespace, while it is opted in (`.optInLabel`, a label only the cluster's
owner can set on a namespace): where the owner's admission policies, bound once, act. */}}
{{- define "tmi.tenantNamespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: {{ .optInLabel }}
      operator: In
      values: ["enabled"]
{{- end }}

{{/* The extender's CA as the owner's scheduler reads it: the ca.crt of the extender's serving
certificate Secret, mounted at this path (scheduler-deployment.yaml). */}}
{{- define "tmi.schedulerCAFile" -}}
/etc/kubernetes/kamiwaza-scheduler/extender-ca/ca.crt
{{- end -}}

{{/* The owner scheduler's KubeSchedulerConfiguration: owner.scheduler.config when the owner
passes one (its scheduler and lock names must be schedulerName), else rendered here from the
values, exactly as the core's inference_policy.placing.schedconfig.render_scheduler_config renders it
for these inputs (tests/chart/test_chart.py holds the two equal). */}}
{{- define "tmi.schedulerConfig" -}}
{{- $name := .Values.core.inferenceResources.schedulerName -}}
{{- $s := .Values.owner.scheduler -}}
{{- if $s.config -}}
{{- $given := fromYaml $s.config -}}
{{- if hasKey $given "Error" -}}
{{- fail (printf "owner.scheduler.config is not YAML: %s" (get $given "Error")) -}}
{{- end -}}
{{- $profiles := $given.profiles | default list -}}
{{- $named := "" -}}
{{- if $profiles }}{{ $named = (first $profiles).schedulerName | default "" }}{{ end -}}
{{- if ne $named $name -}}
{{- fail (printf "owner.scheduler.config names scheduler %q but core.inferenceResources.schedulerName is %q: engine Pods would stay Pending; render it with --scheduler-name %s, or leave owner.scheduler.config empty and the chart renders it" $named $name $name) -}}
{{- end -}}
{{- $lock := (($given.leaderElection | default dict).resourceName) | default "" -}}
{{- if ne $lock $name -}}
{{- fail (printf "owner.scheduler.config takes leader-election lock %q, but the chart's Role grants only the Lease %q: render it with --scheduler-name %s" $lock $name $name) -}}
{{- end -}}
{{- $s.config | trim -}}
{{- else -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceLock: leases
  resourceName: {{ $name }}
  resourceNamespace: {{ .Release.Namespace }}
profiles:
  - schedulerName: {{ $name }}
    pluginConfig:
      - name: NodeResourcesFit
        args:
          scoringStrategy:
            type: MostAllocated
            resources:
              - name: cpu
                weight: 1
              - name: memory
                weight: 1
extenders:
  - urlPrefix: {{ $s.extenderURL | default (printf "https://tmi-extender.%s.svc:443" .Release.Namespace) }}
    filterVerb: filter
    prioritizeVerb: prioritize
    weight: {{ $s.weight }}
    enableHTTPS: true
    httpTimeout: {{ $s.httpTimeout }}
    nodeCacheCapable: true
    ignorable: false
    tlsConfig:
      caFile: {{ include "tmi.schedulerCAFile" . }}
      {{- with $s.extenderServerName }}
      serverName: {{ . }}
      {{- end }}
{{- end -}}
{{- end -}}


{{/* What every tmi server's Pod takes from the owner's or installer's scheduling values
(priorityClassName, nodeSelector, tolerations), below its serviceAccountName. */}}
{{- define "tmi.podScheduling" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The installer's podAnnotations, on every tmi server's Pod template, beside the chart's own
(which win: the checksums roll the servers, and the mesh opt-out keeps them reachable). */}}
{{- define "tmi.podAnnotations" -}}
{{- range $key, $value := .Values.podAnnotations }}
{{- if not (or (hasPrefix "checksum/" $key) (eq $key "sidecar.istio.io/inject")) }}
{{ $key }}: {{ $value | quote }}
{{- end }}
{{- end }}
{{- end -}}


{{/* The owner scheduler's image: owner.scheduler.image when set, else kube-scheduler of the
cluster's own version (a distribution's suffix, +k3s1 or -eks-..., dropped), relocated by
global.imageRegistryPrefix as every chart image is. */}}
{{- define "tmi.schedulerImage" -}}
{{- if .Values.owner.scheduler.image -}}
{{- .Values.owner.scheduler.image -}}
{{- else -}}
{{- $version := regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- $repo := "registry.k8s.io/kube-scheduler" -}}
{{- with .Values.global.imageRegistryPrefix -}}
{{- $repo = printf "%s/images/kube-scheduler" (trimSuffix "/" .) -}}
{{- end -}}
{{- printf "%s:%s" $repo $version -}}
{{- end -}}
{{- end -}}

{{/* What the owner decides for one tenant namespace (`t`, an entry of tmi.ownerTenants) that the
admission policies read: the spec of its TenantAdmission and of its TenantPolicy alike, besides
the namespace, the scheduler and the version floor. */}}
{{- define "tmi.tenantPolicySpec" -}}
{{- $t := .t -}}
{{- $r := .root -}}
{{- $dra := index ($r.Values.owner.dra | default dict) $t.namespace | default dict -}}
{{- $classes := list -}}
{{- range ($dra.deviceClasses | default list) }}{{ $classes = append $classes .name }}{{ end -}}
{{- $templates := list -}}
{{- range ($dra.claimTemplates | default list) -}}
{{- $templates = append $templates (dict "name" .name "deviceClasses" .deviceClasses "count" .count) -}}
{{- end -}}
# The DRA objects the owner published for this namespace (owner.dra, from `tmi render dra`):
# the claims policy's parameters.
deviceClasses: {{ toJson $classes }}
claimTemplates: {{ toJson $templates }}
# The one identity the verdict policy lets change the AllocationVerified condition.
allocationController: system:serviceaccount:{{ $r.Release.Namespace }}:tmi-allocation-controller
# Who besides the cluster's own components may write a Pod's status here (the status policy):
# the owner's scheduler, the allocation controller, and whom owner.statusWriters adds.
{{- $writers := list (printf "system:serviceaccount:%s:%s" $r.Release.Namespace $r.Values.core.inferenceResources.schedulerName) (printf "system:serviceaccount:%s:tmi-allocation-controller" $r.Release.Namespace) }}
statusWriters: {{ toJson (concat $writers ($r.Values.owner.statusWriters | default list)) }}
# The PriorityClasses a Pod here may name (the guard policy): the owner's list for the tenant
# and the cluster's globalDefault class, which the API server fills in for a Pod naming none.
{{- $priority := $t.priorityClasses | default list }}
{{- range (lookup "scheduling.k8s.io/v1" "PriorityClass" "" "").items | default list }}
{{- if .globalDefault }}{{ $priority = append $priority .metadata.name }}{{ end }}
{{- end }}
priorityClasses: {{ toJson ($priority | uniq) }}
{{- end -}}
