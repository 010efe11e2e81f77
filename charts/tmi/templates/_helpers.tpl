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
{{- $first := dict "namespace" (include "tmi.tenantNamespace" .) "suffix" "" "bundleConfigMap" $ir.bundleConfigMap "followRevisions" $ir.followRevisions "ownerPublicKey" $ir.ownerPublicKey "clusterBindingId" $ir.clusterBindingId "minimumBundleVersion" ($ir.minimumBundleVersion | int) "gpuRecipeCatalogConfigMap" ($ir.gpuRecipeCatalogConfigMap | default "") "cpuRecipeCatalogConfigMap" ($ir.cpuRecipeCatalogConfigMap | default "") "webhookUrl" $o.webhook.url "caBundle" $o.webhook.caBundle -}}
{{- $all := list $first -}}
{{- range $o.tenants -}}
{{- $t := merge (dict "namespace" .namespace "suffix" (printf "-%s" .namespace) "webhookUrl" ((.webhook | default dict).url | default "") "caBundle" ((.webhook | default dict).caBundle | default "")) (omit . "webhook") (omit $first "namespace" "suffix" "webhookUrl" "caBundle") -}}
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
{{- with .Values.global.imagePullSecrets -}}
{{- $first := first . -}}
{{- if kindIs "map" $first -}}{{ $first.name }}{{- else -}}{{ $first }}{{- end -}}
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

{{/* One tenant namespace, and only while it is opted in: the owner's admission policies. */}}
{{- define "tmi.tenantNamespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: {{ .o.optInLabel }}
      operator: In
      values: ["enabled"]
    - key: kubernetes.io/metadata.name
      operator: In
      values: [{{ .ns | quote }}]
{{- end }}
