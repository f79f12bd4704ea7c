{{/* vim: set filetype=mustache: */}}

{{- define "hami.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* With release name "hami" this is "hami", giving hami-scheduler, hami-webhook, ... */}}
{{- define "hami.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "hami.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "hami.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Common labels; call with (dict "ctx" $ "component" "scheduler"). */}}
{{- define "hami.labels" -}}
helm.sh/chart: {{ include "hami.chart" .ctx }}
{{ include "hami.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: hami
{{- with .ctx.Values.global.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "hami.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hami.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{/*
metadata.annotations from global.annotations (+ the dict .extra), already indented for metadata
and starting with a newline; nothing when empty. Use as: {{- include "hami.annotations" (dict "ctx" $) }}
*/}}
{{- define "hami.annotations" -}}
{{- $all := merge (deepCopy (.extra | default dict)) (.ctx.Values.global.annotations | default dict) -}}
{{- if $all -}}
{{- printf "\n%s" (toYaml (dict "annotations" $all) | indent 2) -}}
{{- end -}}
{{- end -}}

{{- define "hami.mthreadsEnabled" -}}
{{- if .Values.devices.mthreads.enabled -}}true{{- end -}}
{{- end -}}

{{- define "hami.webhookEnabled" -}}
{{- if and .Values.devices.mthreads.enabled .Values.scheduler.admissionWebhook.enabled -}}true{{- end -}}
{{- end -}}

{{- define "hami.bundledRedis" -}}
{{- if and .Values.devices.mthreads.enabled (not .Values.redis.external.url) -}}true{{- end -}}
{{- end -}}

{{/*
The settings with a fixed set of values, the one place they are listed: each field's allowed values and, where null or
missing is allowed, what it then means (`helm upgrade --reuse-values` from a chart without the value renders with
that chart's values; `--set x=null` deletes the default). values.schema.json only describes these fields: its enum
would refuse a wrong value first, naming the field and the allowed values but not the value given, and a wrong type
as "got number, want string". templates/validate.yaml checks every one on each render; templates read them through
hami.choice. The policies' defaults are the roles' (shared/config.py Config).
*/}}
{{- define "hami.choices" -}}
{{- $pull := dict "allowed" (list "Always" "IfNotPresent" "Never") "default" "" -}}{{- /* "": Kubernetes' default */ -}}
{{- $policy := list "binpack" "spread" -}}
{{- dict
  "scheduler.extender.scheme" (dict "allowed" (list "http" "https") "default" "http")
  "tls.mode" (dict "allowed" (list "generate" "certManager" "external") "default" "generate")
  "scheduler.admissionWebhook.failurePolicy" (dict "allowed" (list "Fail" "Ignore") "default" "Fail")
  "scheduler.admissionWebhook.reinvocationPolicy" (dict "allowed" (list "Never" "IfNeeded") "default" "Never")
  "scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy" (dict "allowed" $policy "default" "binpack")
  "scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy" (dict "allowed" $policy "default" "spread")
  "mtsched.logLevel" (dict "allowed" (list "debug" "info" "warning" "error"))
  "mtsched.logFormat" (dict "allowed" (list "json" "text"))
  "image.pullPolicy" $pull
  "scheduler.kubeScheduler.image.pullPolicy" $pull
  "redis.image.pullPolicy" $pull
  | toJson -}}
{{- end -}}

{{/* (dict "field" "value" "allowed"): the value when it is one of allowed, else fail naming the three, e.g.
scheduler.extender.scheme: "htp" is not allowed; use one of http, https */}}
{{- define "hami.oneOf" -}}
{{- if not (and (kindIs "string" .value) (has .value .allowed)) -}}
{{- fail (printf "%s: %s is not allowed; use one of %s" .field (toRawJson .value) (join ", " .allowed)) -}}
{{- end -}}
{{- .value -}}
{{- end -}}

{{/* The value of a field of hami.choices, checked; call with (dict "ctx" $ "field" "scheduler.extender.scheme"). */}}
{{- define "hami.choice" -}}
{{- $spec := get (include "hami.choices" .ctx | fromJson) .field -}}
{{- $v := .ctx.Values -}}
{{- $found := true -}}
{{- range $key := splitList "." .field -}}
{{- if and $found (kindIs "map" $v) (hasKey $v $key) -}}{{- $v = index $v $key -}}{{- else -}}{{- $found = false -}}{{- end -}}
{{- end -}}
{{- if and (or (not $found) (kindIs "invalid" $v)) (hasKey $spec "default") -}}
{{- $spec.default -}}
{{- else -}}
{{- include "hami.oneOf" (dict "field" .field "value" (ternary $v nil $found) "allowed" $spec.allowed) -}}
{{- end -}}
{{- end -}}

{{/* http | https: how kube-scheduler calls its extender sidecar (scheduler.extender.scheme); missing or null: http. */}}
{{- define "hami.extenderScheme" -}}
{{- include "hami.choice" (dict "ctx" . "field" "scheduler.extender.scheme") -}}
{{- end }}

{{/* generate | certManager | external (HAMi's scheduler.certManager.enabled selects certManager). */}}
{{- define "hami.tlsMode" -}}
{{- $mode := include "hami.choice" (dict "ctx" . "field" "tls.mode") -}}
{{- if .Values.scheduler.certManager.enabled -}}{{- $mode = "certManager" -}}{{- end -}}
{{- $mode -}}
{{- end -}}

{{- define "hami.tlsSecretName" -}}
{{- if and (eq (include "hami.tlsMode" .) "external") .Values.tls.external.secretName -}}
{{- .Values.tls.external.secretName -}}
{{- else -}}
{{- printf "%s-scheduler-tls" (include "hami.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "hami.webhookServiceName" -}}
{{- printf "%s-webhook" (include "hami.fullname" .) -}}
{{- end -}}

{{/* DNS names the serving certificate carries (webhook Service); the extender uses IP 127.0.0.1. */}}
{{- define "hami.tlsDnsNames" -}}
{{- $svc := include "hami.webhookServiceName" . -}}
{{- $ns := include "hami.namespace" . -}}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) "localhost" | toJson -}}
{{- end -}}

{{/*
Self-signed CA + serving certificate for tls.mode=generate, as a dict with keys ca.crt, tls.crt,
tls.key (PEM). Reuses the existing Secret (lookup) so upgrades keep the certificate; computed
once per render and cached, so the Secret and the webhook's caBundle always agree.
*/}}
{{- define "hami.generatedTLS" -}}
{{- $cache := .Values.__generatedTLS | default dict -}}
{{- if not $cache -}}
{{- $ns := include "hami.namespace" . -}}
{{- $name := include "hami.tlsSecretName" . -}}
{{- $existing := lookup "v1" "Secret" $ns $name -}}
{{- $data := (get ($existing | default dict) "data") | default dict -}}
{{- if and (get $data "ca.crt") (get $data "tls.crt") (get $data "tls.key") -}}
{{- $_ := set $cache "ca.crt" (get $data "ca.crt" | b64dec) -}}
{{- $_ := set $cache "tls.crt" (get $data "tls.crt" | b64dec) -}}
{{- $_ := set $cache "tls.key" (get $data "tls.key" | b64dec) -}}
{{- else -}}
{{- $days := int .Values.tls.generate.validityDays -}}
{{- $ca := genCA (printf "%s-ca" (include "hami.fullname" .)) $days -}}
{{- $cert := genSignedCert (include "hami.webhookServiceName" .) (list "127.0.0.1") (include "hami.tlsDnsNames" . | fromJsonArray) $days $ca -}}
{{- $_ := set $cache "ca.crt" $ca.Cert -}}
{{- $_ := set $cache "tls.crt" $cert.Cert -}}
{{- $_ := set $cache "tls.key" $cert.Key -}}
{{- end -}}
{{- $_ := set .Values "__generatedTLS" $cache -}}
{{- end -}}
{{- toJson $cache -}}
{{- end -}}

{{/* base64 CA bundle for the webhook clientConfig; empty when cert-manager injects it. */}}
{{- define "hami.caBundle" -}}
{{- $mode := include "hami.tlsMode" . -}}
{{- if eq $mode "generate" -}}
{{- get (include "hami.generatedTLS" . | fromJson) "ca.crt" | b64enc -}}
{{- else if eq $mode "external" -}}
{{- .Values.tls.external.caBundle -}}
{{- end -}}
{{- end -}}

{{/* A string trimmed of blanks and of one pair of matching quotes around it (--set 'x={96,"160"}' keeps the quotes). */}}
{{- define "hami.unquote" -}}
{{- regexReplaceAll "^\"(.*)\"$|^'(.*)'$" (trim .) "${1}${2}" | trim -}}
{{- end -}}

{{/* memoryPerCard as the list of ints the roles read: sorted, each model once. The roles' rule
(shared/domain/models.py parse_memory_per_card) is the reference, and tests/deploy/test_memory_per_card_agreement.py
holds both to one table: a list (entries whole numbers or quoted whole numbers), a legacy scalar, or a comma string
"96,160" / "[96, 160]" (blank pieces skipped); null or missing (--reuse-values from a chart without it) is the roles'
default, 96. values.schema.json only describes it, so that a wrong value gets this message and not the schema's
alternatives: anything else fails naming the field, the value given and what is allowed. The range is
shared/domain/models.py's (2..MAX_MODEL_UNITS). */}}
{{- define "hami.memoryPerCard" -}}
{{- $raw := .Values.devices.mthreads.memoryPerCard -}}
{{- $field := "devices.mthreads.memoryPerCard" -}}
{{- $allowed := "allowed: whole numbers of 512 MiB units per card, one per card model (96 for MTT S4000, 160 for MTT S5000), as one number or a list, e.g. 96 or [96, 160]" -}}
{{- $items := list -}}
{{- if kindIs "slice" $raw -}}
{{- $items = $raw -}}
{{- if eq (toRawJson $raw) "[\"\"]" -}}{{- $items = list -}}{{- end -}}{{- /* --set memoryPerCard={} */ -}}
{{- else if kindIs "string" $raw -}}
{{- $body := include "hami.unquote" $raw | trimPrefix "[" | trimSuffix "]" -}}
{{- range splitList "," $body -}}{{- if trim . -}}{{- $items = append $items (trim .) -}}{{- end -}}{{- end -}}
{{- else if kindIs "invalid" $raw -}}
{{- $items = list 96 -}}{{- /* shared/domain/models.py DEFAULT_MODEL */ -}}
{{- else -}}
{{- $items = list $raw -}}
{{- end -}}
{{- if not $items -}}
{{- fail (printf "%s %s is empty: list at least one card model; %s" $field (toRawJson $raw) $allowed) -}}
{{- end -}}
{{- /* one value names itself; an entry of several names the whole value too */ -}}
{{- $single := and (not (kindIs "slice" $raw)) (eq (len $items) 1) -}}
{{- $out := list -}}
{{- range $items -}}
{{- $entry := . -}}
{{- if kindIs "string" $entry -}}{{- $entry = include "hami.unquote" $entry -}}{{- end -}}
{{- $what := printf "%s entry %s (of %s)" $field (toRawJson $entry) (toRawJson $raw) -}}
{{- if $single -}}{{- $what = printf "%s %s" $field (toRawJson $raw) -}}{{- end -}}
{{- $f := 0.0 -}}
{{- if and (kindIs "string" $entry) (regexMatch "^-?[0-9]+$" $entry) -}}
{{- $f = float64 $entry -}}
{{- else if or (kindIs "int" $entry) (kindIs "int64" $entry) (kindIs "float64" $entry) -}}
{{- $f = float64 $entry -}}
{{- if ne (floor $f) $f -}}
{{- fail (printf "%s is not a whole number; %s" $what $allowed) -}}
{{- end -}}
{{- else -}}
{{- fail (printf "%s is not a whole number; %s" $what $allowed) -}}
{{- end -}}
{{- if or (lt $f 2.0) (gt $f 4096.0) -}}
{{- fail (printf "%s is out of range: a card has 2 to 4096 units of 512 MiB; %s" $what $allowed) -}}
{{- end -}}
{{- $v := int $f -}}
{{- /* the seeds give each card's memory in GiB beside its units: 48 GiB = 96 units (S4000), 80 GiB = 160 (S5000) */ -}}
{{- range $model := list (list 48 "MTT S4000" 96) (list 80 "MTT S5000" 160) -}}
{{- if eq $v (index $model 0) -}}
{{- fail (printf "devices.mthreads.memoryPerCard entry %d is %s's memory in GiB; the unit is 512 MiB: use %d (no Moore Threads card with sGPU has %d units)" $v (index $model 1) (index $model 2) $v) -}}
{{- end -}}
{{- end -}}
{{- $out = append $out (printf "%04d" $v) -}}{{- /* zero-padded (2..4096): sorted as text is sorted as numbers */ -}}
{{- end -}}
{{- $models := list -}}
{{- range ($out | uniq | sortAlpha) -}}{{- $models = append $models (atoi .) -}}{{- end -}}
{{- toJson $models -}}
{{- end -}}

{{/* Resource names kube-scheduler leaves to the extender (ignoredByScheduler). */}}
{{- define "hami.managedResources" -}}
{{- $m := .Values.devices.mthreads -}}
{{- $names := list $m.resourceCountName -}}
{{- range ($m.customresources | default list) -}}
{{- $names = append $names . -}}
{{- end -}}
{{- toJson ($names | uniq) -}}
{{- end -}}

{{/* kube-scheduler image tag: scheduler.kubeScheduler.image.tag, legacy imageTag, or the cluster's version. */}}
{{- define "hami.kubeSchedulerTag" -}}
{{- $ks := .Values.scheduler.kubeScheduler -}}
{{- $tag := (($ks.image | default dict).tag) | default $ks.imageTag -}}
{{- if not $tag -}}
{{- $tag = regexFind "v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- end -}}
{{- if not (hasPrefix "v" (toString $tag)) -}}{{- $tag = printf "v%s" (toString $tag) -}}{{- end -}}
{{- $tag -}}
{{- end -}}

{{/* The minor of the chart's kube-scheduler (its image tag, Kubernetes 1.x), "" if unreadable. The twin of
shared/domain/nudge.py minor_of. */}}
{{- define "hami.kubeSchedulerMinor" -}}
{{- $m := regexFind "^v1\\.[0-9]+\\.[0-9]+" (include "hami.kubeSchedulerTag" .) -}}
{{- if $m -}}{{- regexReplaceAll "^v1\\.([0-9]+)\\..*$" $m "${1}" -}}{{- end -}}
{{- end -}}

{{/* Whether the chart's kube-scheduler (its image tag) requeues every pod an extender turned away on any Node's update:
1.34 or newer, where queueing hints are always on. The twin of shared/domain/nudge.py any_node_wakes (tests/deploy/
test_chart.py proves they agree); anything it cannot read is false (Node by Node works with every version). */}}
{{- define "hami.nudgeAnyNode" -}}
{{- $minor := include "hami.kubeSchedulerMinor" . -}}
{{- if $minor -}}{{- ge (atoi $minor) 34 -}}{{- else -}}false{{- end -}}
{{- end -}}

{{/* kube-scheduler's arguments its version needs (a JSON list): before 1.32 no Node event requeues a pod asking for
mthreads.com/vgpu (kube-scheduler pre-checks the pod's resources against the Node, ignoredByScheduler not honoured),
so the watchers' nudge cannot wake it: its retry of parked pods is shortened from 5 minutes. The twin of
shared/domain/nudge.py unschedulable_retry_args (tests/deploy/test_chart.py). */}}
{{- define "hami.kubeSchedulerArgs" -}}
{{- $minor := include "hami.kubeSchedulerMinor" . -}}
{{- $args := list -}}
{{- if and $minor (lt (atoi $minor) 32) -}}
{{- $args = append $args "--pod-max-in-unschedulable-pods-duration=10s" -}}
{{- end -}}
{{- toJson $args -}}
{{- end -}}

{{/* kube-scheduler's readiness path: /readyz (informers synced) from 1.31, which first serves it; /healthz before. */}}
{{- define "hami.kubeSchedulerReadyPath" -}}
{{- $minor := include "hami.kubeSchedulerMinor" . -}}
{{- if and $minor (lt (atoi $minor) 31) -}}/healthz{{- else -}}/readyz{{- end -}}
{{- end -}}

{{/* registry/repository:tag with global.imageRegistry taking precedence; call with (dict "ctx" $ "image" $img "tag" $tag). */}}
{{- define "hami.image" -}}
{{- $registry := .ctx.Values.global.imageRegistry | default .image.registry -}}
{{- $tag := .tag | default .image.tag | default .ctx.Chart.AppVersion -}}
{{- if $registry -}}
{{- printf "%s/%s:%s" $registry .image.repository (toString $tag) -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (toString $tag) -}}
{{- end -}}
{{- end -}}

{{/* imagePullSecrets for a pod spec (indent 6), starting with a newline; nothing when empty. */}}
{{- define "hami.imagePullSecrets" -}}
{{- with .Values.global.imagePullSecrets -}}
{{- $list := list -}}
{{- range . -}}{{- $list = append $list (dict "name" .) -}}{{- end -}}
{{- printf "\n%s" (toYaml (dict "imagePullSecrets" $list) | indent 6) -}}
{{- end -}}
{{- end -}}

{{/*
The redisUrl of the config: never a password (that comes from a Secret, see hami.env); the
username of redis.external.username goes into it.
*/}}
{{- define "hami.redisUrl" -}}
{{- $ext := .Values.redis.external -}}
{{- if $ext.url -}}
{{- $url := $ext.url -}}
{{- if or (regexMatch "://[^/@?]*:[^/@?]*@" $url) (regexMatch "[?&](sentinel_)?pass(word)?=[^&#]" $url) -}}
{{- fail "redis.external.url carries a password, which would be written into the ConfigMap every role reads: put it into a Secret (redis.external.existingSecret, passwordKey) and the user into redis.external.username" -}}
{{- end -}}
{{- if and $ext.existingSecret (not (regexMatch "^(redis|rediss|redis\\+sentinel|redis\\+cluster)://[^@/]+(/.*)?$" $url)) -}}
{{- fail "redis.external.url must look like redis://host:port/db, rediss://host:port/db, redis+sentinel://host:26379[,host:26379]/service[/db] or redis+cluster://host:port[,host:port] (no user or password: use redis.external.username and existingSecret)" -}}
{{- end -}}
{{- if and ($ext.tls | default dict).caSecret (not (hasPrefix "rediss://" $url)) -}}
{{- fail "redis.external.tls.caSecret needs a rediss:// redis.external.url (TLS is available for single-endpoint Redis only)" -}}
{{- end -}}
{{- if and $ext.existingSecret $ext.username -}}
{{- $scheme := regexFind "^(rediss?|redis\\+sentinel|redis\\+cluster)://" $url -}}
{{- printf "%s%s@%s" $scheme ($ext.username | urlquery) (trimPrefix $scheme $url) -}}
{{- else -}}
{{- $url -}}
{{- end -}}
{{- else -}}
{{- printf "redis://%s-redis.%s.svc:6379/0" (include "hami.fullname" .) (include "hami.namespace" .) -}}
{{- end -}}
{{- end -}}

{{/*
The ledger a Redis URL reaches, for the chart's check of a ledger move (validate.yaml): without the ACL user
(redis.external.username: a new user of the same Redis is no move) and the query (client options; kept when it
names a db), and for
redis:// and rediss:// with the port and database the roles default to (6379, 0), so that redis://h, redis://h/0
and redis://h:6379/0 are one ledger. Another host, port, database, sentinel service or scheme is another.
*/}}
{{- define "hami.ledgerAddress" -}}
{{- /* (the user ends at the last "@" before the path, query or fragment, as redis-py's urlparse reads it: an "@"
in a query option is no user, and the host before it stays) */ -}}
{{- $u := regexReplaceAll "^([a-z+]+://)[^/?#]*@" . "${1}" -}}
{{- if not (regexMatch "[?&]db=" $u) -}}{{- /* (a db option overrides the path's: then kept, compared as written) */ -}}
{{- $u = regexReplaceAll "[?#].*$" $u "" -}}
{{- end -}}
{{- if regexMatch "^rediss?://" $u -}}
{{- $u = regexReplaceAll "^(rediss?://(\\[[^\\]]*\\]|[^/:?#\\[]+))([/?]|$)" $u "${1}:6379${3}" -}}
{{- $u = regexReplaceAll "^(rediss?://[^/?]+)/?$" $u "${1}/0" -}}
{{- end -}}
{{- $u -}}
{{- end -}}

{{/*
The Secret key holding the Redis password, as JSON {"name", "key"}; {} without a password. Bundled
Redis: redis.auth (redis.auth.existingSecret, or <fullname>-redis-auth generated by the chart).
External: redis.external.existingSecret.
*/}}
{{- define "hami.redisPasswordRef" -}}
{{- $r := .Values.redis -}}
{{- if $r.external.url -}}
{{- if $r.external.existingSecret -}}
{{- dict "name" $r.external.existingSecret "key" $r.external.passwordKey | toJson -}}
{{- else -}}
{}
{{- end -}}
{{- else if $r.auth.enabled -}}
{{- if $r.auth.existingSecret -}}
{{- dict "name" $r.auth.existingSecret "key" $r.auth.passwordKey | toJson -}}
{{- else -}}
{{- dict "name" (printf "%s-redis-auth" (include "hami.fullname" .)) "key" "password" | toJson -}}
{{- end -}}
{{- else -}}
{}
{{- end -}}
{{- end -}}

{{/*
Environment shared by our containers. The Redis password and CA come from Secrets (secretKeyRef):
the pod spec and the ConfigMap name the Secret, never its contents; any character may be used.
*/}}
{{- define "hami.env" -}}
- name: MTSCHED_CONFIG
  value: /etc/mtsched/config.yaml
{{- $pw := include "hami.redisPasswordRef" . | fromJson }}
{{- if $pw }}
- name: MTSCHED_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $pw.name }}
      key: {{ $pw.key }}
{{- end }}
{{- $ext := .Values.redis.external }}
{{- $tls := $ext.tls | default dict }}
{{- if and $ext.url $tls.caSecret }}
- name: MTSCHED_REDIS_CA
  valueFrom:
    secretKeyRef:
      name: {{ $tls.caSecret }}
      key: {{ $tls.caKey | default "ca.crt" }}
{{- end }}
{{- end -}}

{{/* Pod-level security context for our containers (image user 10001). */}}
{{- define "hami.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .uid | default 10001 }}
runAsGroup: {{ .uid | default 10001 }}
fsGroup: {{ .uid | default 10001 }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "hami.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* Preferred anti-affinity on hostname for a component unless .affinity is given. */}}
{{- define "hami.affinity" -}}
{{- if .affinity -}}
affinity:
  {{- toYaml .affinity | nindent 2 }}
{{- else -}}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "hami.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 14 }}
{{- end -}}
{{- end -}}

{{/* Probes of an mtsched role on the metrics port. */}}
{{- define "hami.probes" -}}
startupProbe:
  httpGet: {path: /healthz, port: metrics}
  periodSeconds: 5
  failureThreshold: 60
livenessProbe:
  httpGet: {path: /healthz, port: metrics}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: metrics}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end -}}

{{/* Pod annotations only the scheduler writes (shared/domain/annotations.py SCHEDULER_OWNED_KEYS); a test keeps them in sync. */}}
{{- define "hami.ownedAnnotations" -}}
{{- $keys := list "hami.io/mthreads-vgpu-devices-allocated" "hami.io/mthreads-vgpu-devices-to-allocate" "mthreads.com/gpu-index" "mthreads.com/predicate-node" "mthreads.com/predicate-time" "hami.io/vgpu-node" "hami.io/vgpu-time" "hami.io/bind-phase" "hami.io/bind-time" -}}
{{- printf "'%s'" (join "', '" $keys) -}}
{{- end -}}

{{/* The subset that steers the vendor device plugin (shared/domain/annotations.py MTHREADS_OWNED_KEYS): ours on any pod. */}}
{{- define "hami.mthreadsOwnedAnnotations" -}}
{{- $keys := list "hami.io/mthreads-vgpu-devices-allocated" "hami.io/mthreads-vgpu-devices-to-allocate" "mthreads.com/gpu-index" "mthreads.com/predicate-node" "mthreads.com/predicate-time" -}}
{{- printf "'%s'" (join "', '" $keys) -}}
{{- end -}}
