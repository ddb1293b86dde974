{{/*
Named templates of the statestore-gateway chart.

Every template here takes one dict:
  root    the top-level context ($)
  values  this chart's values: .Values inside this chart; in a chart that
          has this one as a dependency, (index .Values "statestore-gateway")
and some take more keys, listed on each. They read nothing else, so they work
the same when a parent chart includes them.
*/}}

{{- define "statestore-gateway.name" -}}
{{- default "statestore-gateway" .values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Resource name prefix. Not derived from .Chart, which is the parent's
chart when a parent includes these templates. */}}
{{- define "statestore-gateway.fullname" -}}
{{- if .values.fullnameOverride -}}
{{- .values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "statestore-gateway.name" . -}}
{{- if contains $name .root.Release.Name -}}
{{- .root.Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .root.Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of the emulator's Deployment, ConfigMap and Service. */}}
{{- define "statestore-gateway.emulatorName" -}}
{{- printf "%s-emulator" (include "statestore-gateway.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "statestore-gateway.serviceAccountName" -}}
{{- default (include "statestore-gateway.fullname" .) .values.serviceAccount.name -}}
{{- end -}}

{{- define "statestore-gateway.image" -}}
{{- $i := .values.image -}}
{{- if $i.digest -}}
{{- printf "%s@%s" $i.repository $i.digest -}}
{{- else -}}
{{- printf "%s:%s" $i.repository $i.tag -}}
{{- end -}}
{{- end -}}

{{/* Labels of this chart's own resources. Extra key: component. */}}
{{- define "statestore-gateway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "statestore-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .values.image.tag | quote }}
app.kubernetes.io/part-of: statestore-gateway
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{/* Labels a Deployment selects its pods by. Extra key: component. */}}
{{- define "statestore-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "statestore-gateway.name" . }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* "true" when the gateway uses TLS to the broker, "" otherwise. The
emulator's mosquitto speaks plain MQTT. */}}
{{- define "statestore-gateway.useTls" -}}
{{- if and .values.broker.tls.enabled (not .values.emulator.enabled) }}true{{ end -}}
{{- end -}}

{{/* "true" when the gateway authenticates with a service account token. */}}
{{- define "statestore-gateway.useSat" -}}
{{- if and .values.broker.sat.enabled (not .values.emulator.enabled) }}true{{ end -}}
{{- end -}}

{{/* Fails on values the gateway would refuse at start, or that cannot work
together. Renders nothing. The schema holds the bounds of single values. */}}
{{- define "statestore-gateway.checks" -}}
{{- $v := .values -}}
{{- if and (include "statestore-gateway.useSat" .) $v.broker.passwordSecret.name -}}
{{- fail "broker.sat.enabled and broker.passwordSecret.name: the gateway authenticates with one of a service account token or a password; set broker.sat.enabled=false to use the password" -}}
{{- end -}}
{{- if eq (int $v.gateway.port) (int $v.gateway.adminPort) -}}
{{- fail (printf "gateway.port and gateway.adminPort are both %d: the key API and the admin listener need a port each" (int $v.gateway.port)) -}}
{{- end -}}
{{- end -}}

{{/* terminationGracePeriodSeconds for a pod running the gateway: the
gateway's drain time plus 10 s for the kubelet and the app. */}}
{{- define "statestore-gateway.terminationGracePeriodSeconds" -}}
{{- add (int .values.gateway.shutdownGraceSeconds) 10 -}}
{{- end -}}

{{/*
statestore-gateway.sidecar.container: the gateway container, rendered as one
item of a list. Put it under the pod's `containers`, or under
`initContainers` when values.sidecar.native is true (it then carries
restartPolicy: Always). Pair it with statestore-gateway.sidecar.volumes.
Extra key: standalone (bool): the key API listens on all interfaces and
declares its port; used by this chart's standalone Deployment.
*/}}
{{- define "statestore-gateway.sidecar.container" -}}
{{- $v := .values -}}
{{- $g := $v.gateway -}}
{{- $standalone := .standalone | default false -}}
{{- $native := and $v.sidecar.native (not $standalone) -}}
{{- if and $native (semverCompare "<1.29-0" .root.Capabilities.KubeVersion.Version) -}}
{{- fail "sidecar.native needs Kubernetes 1.29 or newer" -}}
{{- end -}}
{{- include "statestore-gateway.checks" . -}}
{{- $tls := include "statestore-gateway.useTls" . -}}
{{- $sat := include "statestore-gateway.useSat" . -}}
{{- $apiTls := include "statestore-gateway.apiTlsSecret" . -}}
{{- $dir := "/var/run/secrets/statestore-gateway" -}}
{{- $authz := include "statestore-gateway.authzConfigMap" . -}}
- name: statestore-gateway
  image: {{ include "statestore-gateway.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  args: ["serve"]
  {{- if $native }}
  restartPolicy: Always
  {{- end }}
  env:
    - name: STATESTORE_GATEWAY_LISTEN
      value: {{ printf "%s:%d" (ternary "0.0.0.0" "127.0.0.1" $standalone) (int $g.port) | quote }}
    - name: STATESTORE_GATEWAY_ADMIN_LISTEN
      value: {{ printf "0.0.0.0:%d" (int $g.adminPort) | quote }}
    {{- if and $standalone (gt (int $v.standalone.workerThreads) 0) }}
    - name: TOKIO_WORKER_THREADS
      value: {{ int $v.standalone.workerThreads | quote }}
    {{- end }}
    - name: STATESTORE_GATEWAY_POOL_SIZE
      value: {{ int $g.poolSize | quote }}
    - name: STATESTORE_GATEWAY_REQUEST_TIMEOUT
      value: {{ $g.requestTimeout | quote }}
    - name: STATESTORE_GATEWAY_MAX_IN_FLIGHT
      value: {{ int $g.maxInFlight | quote }}
    - name: STATESTORE_GATEWAY_MAX_KEY_BYTES
      value: {{ int $g.maxKeyBytes | quote }}
    {{- if $g.maxValueBytes }}
    - name: STATESTORE_GATEWAY_MAX_VALUE_BYTES
      value: {{ int64 $g.maxValueBytes | quote }}
    {{- end }}
    - name: STATESTORE_GATEWAY_MAX_WATCHERS
      value: {{ int $g.maxWatchers | quote }}
    - name: STATESTORE_GATEWAY_MAX_KEYS_PER_WATCH
      value: {{ int $g.maxKeysPerWatch | quote }}
    - name: STATESTORE_GATEWAY_MAX_WATCHED_KEYS
      value: {{ int $g.maxWatchedKeys | quote }}
    - name: STATESTORE_GATEWAY_WATCH_KEEPALIVE
      value: {{ $g.watchKeepalive | quote }}
    - name: STATESTORE_GATEWAY_WATCH_BUFFER
      value: {{ int $g.watchBuffer | quote }}
    - name: STATESTORE_GATEWAY_WATCH_RESYNC_INTERVAL
      value: {{ $g.watchResyncInterval | quote }}
    - name: STATESTORE_GATEWAY_WATCH_RESCAN_INTERVAL
      value: {{ $g.watchRescanInterval | quote }}
    - name: STATESTORE_GATEWAY_MAX_KEYS_PER_PATTERN
      value: {{ int $g.maxKeysPerPattern | quote }}
    - name: STATESTORE_GATEWAY_MAX_WATCH_PATTERNS
      value: {{ int $g.maxWatchPatterns | quote }}
    - name: STATESTORE_GATEWAY_HEADER_READ_TIMEOUT
      value: {{ $g.headerReadTimeout | quote }}
    - name: STATESTORE_GATEWAY_MAX_CONNECTIONS
      value: {{ int64 $g.maxConnections | quote }}
    - name: STATESTORE_GATEWAY_MAX_BATCH_OPS
      value: {{ int64 $g.maxBatchOps | quote }}
    - name: STATESTORE_GATEWAY_MAX_BATCH_BYTES
      value: {{ int64 $g.maxBatchBytes | quote }}
    - name: STATESTORE_GATEWAY_DAPR_STATE_STORE
      value: {{ $g.daprStateStore | quote }}
    - name: STATESTORE_GATEWAY_DAPR_LOCK_STORE
      value: {{ $g.daprLockStore | quote }}
    - name: STATESTORE_GATEWAY_DAPR_PUBSUB
      value: {{ $g.daprPubsub | quote }}
    - name: STATESTORE_GATEWAY_DAPR_APP_ID
      value: {{ $g.daprAppId | quote }}
    - name: STATESTORE_GATEWAY_DAPR_KEY_PREFIX
      value: {{ $g.daprKeyPrefix | quote }}
    - name: STATESTORE_GATEWAY_DAPR_LOCK_KEY_PREFIX
      value: {{ $g.daprLockKeyPrefix | quote }}
    - name: STATESTORE_GATEWAY_DAPR_CONFIGURATION_STORE
      value: {{ $g.daprConfigurationStore | quote }}
    - name: STATESTORE_GATEWAY_DAPR_CONFIGURATION_KEY_PREFIX
      value: {{ $g.daprConfigurationKeyPrefix | quote }}
    - name: STATESTORE_GATEWAY_DAPR_MAX_BODY_SIZE
      value: {{ int64 $g.daprMaxBodySize | quote }}
    {{- if $g.daprAppPort }}
    - name: STATESTORE_GATEWAY_DAPR_APP_PORT
      value: {{ int64 $g.daprAppPort | quote }}
    {{- end }}
    - name: STATESTORE_GATEWAY_DAPR_APP_PROTOCOL
      value: {{ $g.daprAppProtocol | quote }}
    {{- if $g.corsAllowOrigin }}
    - name: STATESTORE_GATEWAY_CORS_ALLOW_ORIGIN
      value: {{ $g.corsAllowOrigin | quote }}
    {{- end }}
    - name: STATESTORE_GATEWAY_SHUTDOWN_GRACE
      value: {{ printf "%ds" (int $g.shutdownGraceSeconds) | quote }}
    - name: STATESTORE_GATEWAY_LOG_FORMAT
      value: {{ $g.logFormat | quote }}
    - name: RUST_LOG
      value: {{ $g.logLevel | quote }}
    {{- if $g.apiToken.secretName }}
    - name: STATESTORE_GATEWAY_API_TOKEN_FILE
      value: {{ $dir }}/api-token/token
    {{- end }}
    {{- if $g.jwt.jwksConfigMap }}
    - name: STATESTORE_GATEWAY_JWT_JWKS_FILE
      value: {{ $dir }}/jwks/jwks.json
    {{- end }}
    {{- if $g.jwt.jwksUrl }}
    - name: STATESTORE_GATEWAY_JWT_JWKS_URL
      value: {{ $g.jwt.jwksUrl | quote }}
    {{- if $g.jwt.jwksCaConfigMap }}
    - name: STATESTORE_GATEWAY_JWT_JWKS_CA_FILE
      value: {{ $dir }}/jwks-ca/ca.crt
    {{- end }}
    {{- if $g.jwt.jwksServiceAccountToken }}
    - name: STATESTORE_GATEWAY_JWT_JWKS_TOKEN_FILE
      value: {{ $dir }}/jwks-token/token
    {{- end }}
    {{- end }}
    {{- if $g.jwt.issuer }}
    - name: STATESTORE_GATEWAY_JWT_ISSUER
      value: {{ $g.jwt.issuer | quote }}
    {{- end }}
    {{- if $g.jwt.audience }}
    - name: STATESTORE_GATEWAY_JWT_AUDIENCE
      value: {{ $g.jwt.audience | quote }}
    {{- end }}
    {{- if $apiTls }}
    - name: STATESTORE_GATEWAY_API_TLS_CERT_FILE
      value: {{ $dir }}/api-tls/tls.crt
    - name: STATESTORE_GATEWAY_API_TLS_KEY_FILE
      value: {{ $dir }}/api-tls/tls.key
    {{- end }}
    {{- if $authz }}
    - name: STATESTORE_GATEWAY_AUTHZ_FILE
      value: {{ $dir }}/authz/rules.yaml
    {{- end }}
    {{- if $v.emulator.enabled }}
    - name: AIO_BROKER_HOSTNAME
      value: {{ include "statestore-gateway.emulatorName" . | quote }}
    - name: AIO_BROKER_TCP_PORT
      value: "1883"
    {{- else }}
    - name: AIO_BROKER_HOSTNAME
      value: {{ $v.broker.host | quote }}
    - name: AIO_BROKER_TCP_PORT
      value: {{ int $v.broker.port | quote }}
    {{- end }}
    - name: AIO_MQTT_USE_TLS
      value: {{ ternary "true" "false" (eq $tls "true") | quote }}
    {{- if $tls }}
    - name: AIO_TLS_CA_FILE
      value: {{ $dir }}/ca/ca.crt
    {{- if $v.broker.tls.clientCertSecret }}
    - name: AIO_TLS_CERT_FILE
      value: {{ $dir }}/client-cert/tls.crt
    - name: AIO_TLS_KEY_FILE
      value: {{ $dir }}/client-cert/tls.key
    {{- end }}
    {{- end }}
    {{- if $sat }}
    - name: AIO_SAT_FILE
      value: {{ $dir }}/sat/token
    {{- end }}
    {{- if $v.broker.username }}
    - name: AIO_MQTT_USERNAME
      value: {{ $v.broker.username | quote }}
    {{- end }}
    {{- if $v.broker.passwordSecret.name }}
    - name: AIO_MQTT_PASSWORD_FILE
      value: {{ $dir }}/mqtt-password/password
    {{- end }}
    {{- if $v.broker.clientId }}
    # One client id per pod: pods sharing one (a Deployment's, or an old
    # and a new one in a rollout) would take each other's broker sessions.
    - name: STATESTORE_GATEWAY_POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: AIO_MQTT_CLIENT_ID
      value: {{ printf "%s-$(STATESTORE_GATEWAY_POD_NAME)" (replace "$" "$$" $v.broker.clientId) | quote }}
    {{- end }}
    - name: AIO_MQTT_KEEP_ALIVE
      value: {{ int $v.broker.keepAlive | quote }}
    - name: AIO_MQTT_SESSION_EXPIRY
      value: {{ int $v.broker.sessionExpiry | quote }}
    {{- if $v.tracing.otlpEndpoint }}
    - name: OTEL_EXPORTER_OTLP_ENDPOINT
      value: {{ $v.tracing.otlpEndpoint | quote }}
    {{- end }}
    - name: OTEL_TRACES_SAMPLER
      value: {{ $v.tracing.sampler | quote }}
    {{- if $v.tracing.samplerArg }}
    - name: OTEL_TRACES_SAMPLER_ARG
      value: {{ $v.tracing.samplerArg | quote }}
    {{- end }}
    {{- with $g.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    {{- if $standalone }}
    - name: gateway-http
      containerPort: {{ int $g.port }}
    {{- end }}
    - name: gateway-admin
      containerPort: {{ int $g.adminPort }}
  startupProbe:
    httpGet:
      path: /livez
      port: gateway-admin
    {{- toYaml $v.probes.startup | nindent 4 }}
  livenessProbe:
    httpGet:
      path: /livez
      port: gateway-admin
    {{- toYaml $v.probes.liveness | nindent 4 }}
  {{- if $v.probes.readiness.enabled }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: gateway-admin
    {{- toYaml (omit $v.probes.readiness "enabled") | nindent 4 }}
  {{- end }}
  resources:
    {{- toYaml $v.resources | nindent 4 }}
  securityContext:
    {{- toYaml $v.securityContext | nindent 4 }}
  {{- $jwksCa := and $g.jwt.jwksUrl $g.jwt.jwksCaConfigMap }}
  {{- $jwksToken := and $g.jwt.jwksUrl $g.jwt.jwksServiceAccountToken }}
  {{- if or $tls $sat $v.broker.passwordSecret.name $g.apiToken.secretName $g.jwt.jwksConfigMap $jwksCa $jwksToken $apiTls $authz }}
  volumeMounts:
    {{- if $sat }}
    - name: statestore-gateway-sat
      mountPath: {{ $dir }}/sat
      readOnly: true
    {{- end }}
    {{- if $tls }}
    - name: statestore-gateway-ca
      mountPath: {{ $dir }}/ca
      readOnly: true
    {{- if $v.broker.tls.clientCertSecret }}
    - name: statestore-gateway-client-cert
      mountPath: {{ $dir }}/client-cert
      readOnly: true
    {{- end }}
    {{- end }}
    {{- if $v.broker.passwordSecret.name }}
    - name: statestore-gateway-mqtt-password
      mountPath: {{ $dir }}/mqtt-password
      readOnly: true
    {{- end }}
    {{- if $g.apiToken.secretName }}
    - name: statestore-gateway-api-token
      mountPath: {{ $dir }}/api-token
      readOnly: true
    {{- end }}
    {{- if $g.jwt.jwksConfigMap }}
    - name: statestore-gateway-jwks
      mountPath: {{ $dir }}/jwks
      readOnly: true
    {{- end }}
    {{- if $jwksCa }}
    - name: statestore-gateway-jwks-ca
      mountPath: {{ $dir }}/jwks-ca
      readOnly: true
    {{- end }}
    {{- if $jwksToken }}
    - name: statestore-gateway-jwks-token
      mountPath: {{ $dir }}/jwks-token
      readOnly: true
    {{- end }}
    {{- if $apiTls }}
    - name: statestore-gateway-api-tls
      mountPath: {{ $dir }}/api-tls
      readOnly: true
    {{- end }}
    {{- if $authz }}
    # Not a subPath: the kubelet then updates the file when the ConfigMap
    # changes, and the gateway reads it again.
    - name: statestore-gateway-authz
      mountPath: {{ $dir }}/authz
      readOnly: true
    {{- end }}
  {{- end }}
{{- end -}}

{{/*
statestore-gateway.sidecar.appEnv: env items for one of the app's
containers, next to the sidecar: DAPR_HTTP_PORT and DAPR_GRPC_PORT
(gateway.port, where the gateway serves Dapr's API) when
values.sidecar.daprPorts is true; nothing otherwise.
Extra key: container (a dict with the container's own `env` and `envFrom`
lists, as in its spec). A variable the container sets in `env`, or may get
from an `envFrom` source (any without a prefix, or whose prefix begins the
variable's name: the ConfigMap's or Secret's keys are not known here), is
left out, so the app's own value stays (Kubernetes gives `env` priority
over `envFrom`). Without container both variables are rendered: any own
entry of the app must then follow the include in `env` (the kubelet takes
the last entry of a name), and an `envFrom` value is hidden.
*/}}
{{- define "statestore-gateway.sidecar.appEnv" -}}
{{- include "statestore-gateway.sidecar.appEnvItems" . | trim -}}
{{- end -}}

{{/* The items of statestore-gateway.sidecar.appEnv, untrimmed. */}}
{{- define "statestore-gateway.sidecar.appEnvItems" -}}
{{- if .values.sidecar.daprPorts -}}
{{- $container := .container | default dict -}}
{{- range $name := list "DAPR_HTTP_PORT" "DAPR_GRPC_PORT" -}}
{{- $own := false -}}
{{- range ($container.env | default list) -}}
{{- if eq .name $name -}}{{- $own = true -}}{{- end -}}
{{- end -}}
{{- range ($container.envFrom | default list) -}}
{{- if hasPrefix (.prefix | default "") $name -}}{{- $own = true -}}{{- end -}}
{{- end -}}
{{- if not $own }}
- name: {{ $name }}
  value: {{ int $.values.gateway.port | quote }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
statestore-gateway.sidecar.volumes: the volumes the gateway container mounts,
rendered as list items for the pod's `volumes`. Renders nothing when the
gateway needs none (emulator, no secrets).
*/}}
{{- define "statestore-gateway.sidecar.volumes" -}}
{{- include "statestore-gateway.sidecar.volumeItems" . | trim -}}
{{- end -}}

{{/* The items of statestore-gateway.sidecar.volumes, before trimming the
blank line the first `if` leaves. */}}
{{- define "statestore-gateway.sidecar.volumeItems" -}}
{{- $v := .values -}}
{{- if include "statestore-gateway.useSat" . }}
- name: statestore-gateway-sat
  projected:
    sources:
      - serviceAccountToken:
          audience: {{ $v.broker.sat.audience | quote }}
          expirationSeconds: {{ int $v.broker.sat.expirationSeconds }}
          path: token
{{- end }}
{{- if include "statestore-gateway.useTls" . }}
- name: statestore-gateway-ca
  configMap:
    name: {{ $v.broker.tls.caConfigMap | quote }}
    items:
      - key: {{ $v.broker.tls.caKey | quote }}
        path: ca.crt
{{- if $v.broker.tls.clientCertSecret }}
- name: statestore-gateway-client-cert
  secret:
    secretName: {{ $v.broker.tls.clientCertSecret | quote }}
{{- end }}
{{- end }}
{{- if $v.broker.passwordSecret.name }}
- name: statestore-gateway-mqtt-password
  secret:
    secretName: {{ $v.broker.passwordSecret.name | quote }}
    items:
      - key: {{ $v.broker.passwordSecret.key | quote }}
        path: password
{{- end }}
{{- if $v.gateway.apiToken.secretName }}
- name: statestore-gateway-api-token
  secret:
    secretName: {{ $v.gateway.apiToken.secretName | quote }}
    items:
      - key: {{ $v.gateway.apiToken.key | quote }}
        path: token
{{- end }}
{{- $jwt := $v.gateway.jwt }}
{{- if $jwt.jwksConfigMap }}
- name: statestore-gateway-jwks
  configMap:
    name: {{ $jwt.jwksConfigMap | quote }}
    items:
      - key: {{ $jwt.jwksKey | quote }}
        path: jwks.json
{{- end }}
{{- if and $jwt.jwksUrl $jwt.jwksCaConfigMap }}
- name: statestore-gateway-jwks-ca
  configMap:
    name: {{ $jwt.jwksCaConfigMap | quote }}
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- if and $jwt.jwksUrl $jwt.jwksServiceAccountToken }}
- name: statestore-gateway-jwks-token
  projected:
    sources:
      - serviceAccountToken:
          expirationSeconds: 3600
          path: token
{{- end }}
{{- with include "statestore-gateway.apiTlsSecret" . }}
# Renewed in place (cert-manager, kubectl apply): the gateway reads it again.
- name: statestore-gateway-api-tls
  secret:
    secretName: {{ . | quote }}
{{- end }}
{{- with include "statestore-gateway.authzConfigMap" . }}
- name: statestore-gateway-authz
  configMap:
    name: {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
statestore-gateway.apiTlsSecret: the Secret holding the key API's serving
certificate (standalone.tls.secretName, or the one cert-manager issues), or
nothing. Only the standalone gateway serves TLS: extra key standalone (bool).
*/}}
{{- define "statestore-gateway.apiTlsSecret" -}}
{{- if .standalone -}}
{{- $t := .values.standalone.tls -}}
{{- if .values.standalone.tls.secretName -}}
{{- $t.secretName -}}
{{- else if $t.certManager.enabled -}}
{{- printf "%s-tls" (include "statestore-gateway.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
statestore-gateway.authzConfigMap: the name of the ConfigMap holding the
standalone gateway's per-key rules (standalone.authz), or nothing when
there are none. Only the standalone gateway takes rules: extra key
standalone (bool).
*/}}
{{- define "statestore-gateway.authzConfigMap" -}}
{{- if .standalone -}}
{{- $a := .values.standalone.authz -}}
{{- if and $a.rules $a.configMap -}}
{{- fail "standalone.authz.rules and standalone.authz.configMap: give the rules one way" -}}
{{- end -}}
{{- if or $a.rules $a.configMap -}}
{{- if not (or .values.gateway.apiToken.secretName .values.gateway.jwt.jwksConfigMap .values.gateway.jwt.jwksUrl) -}}
{{- fail "standalone.authz needs gateway.apiToken.secretName or gateway.jwt (jwksConfigMap or jwksUrl): rules need callers to be identified" -}}
{{- end -}}
{{- $a.configMap | default (printf "%s-authz" (include "statestore-gateway.fullname" .) | trunc 63 | trimSuffix "-") -}}
{{- end -}}
{{- end -}}
{{- end -}}
