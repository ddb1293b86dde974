//! The sidecar added to one pod spec: the same container, volumes and pod
//! settings that the chart's named templates render
//! (`statestore-gateway.sidecar.container`, `.sidecar.volumes`,
//! `.terminationGracePeriodSeconds`), so that a pod gets the same gateway
//! whichever way it was given one.

use serde_json::{Map, Value, json};

use super::values::secrets::{self, is_sidecar_volume};
use super::values::{Sidecar, container_env};

/// The gateway container's name. A container of this name that is the
/// sidecar (`args: [serve]`, the admin port) is replaced on every
/// injection, which makes injection idempotent; one that is not is the
/// pod's own, and refused.
pub const CONTAINER_NAME: &str = "statestore-gateway";

/// The name of the sidecar's admin port (probes).
const ADMIN_PORT_NAME: &str = "gateway-admin";

/// Why a pod spec cannot take the sidecar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PodError(String);

/// Adds the sidecar to `spec` (a PodSpec), replacing one added before.
/// A container named [`CONTAINER_NAME`] that is not the sidecar, or a
/// volume with one of the sidecar's names that is not the sidecar's alone, is
/// refused rather than replaced: it is the pod's own.
///
/// The container goes under `initContainers` (first, with
/// `restartPolicy: Always`) when `sidecar.native` is set or when the pod
/// does not restart (`restartPolicy` Never or OnFailure: a Job's pods),
/// since a plain container that never exits would keep such a pod running
/// for ever; otherwise it is appended to `containers`.
pub fn add_sidecar(spec: &mut Value, sidecar: &Sidecar) -> Result<(), PodError> {
    let spec = spec
        .as_object_mut()
        .ok_or_else(|| PodError("the pod spec is not a mapping".into()))?;
    if !spec.get("containers").is_some_and(Value::is_array) {
        return Err(PodError("the pod spec has no containers list".into()));
    }
    remove_sidecar(spec)?;
    if sidecar.sidecar.dapr_ports {
        set_dapr_ports(spec, sidecar.gateway.port)?;
    }
    let runs_to_completion = matches!(
        spec.get("restartPolicy").and_then(Value::as_str),
        Some("Never" | "OnFailure")
    );
    let native = sidecar.sidecar.native || runs_to_completion;
    let container = container(sidecar, native);
    if native {
        let init = spec
            .entry("initContainers")
            .or_insert_with(|| Value::Array(Vec::new()));
        let init = init
            .as_array_mut()
            .ok_or_else(|| PodError("initContainers is not a list".into()))?;
        init.insert(0, container);
    } else if let Some(containers) = spec.get_mut("containers").and_then(Value::as_array_mut) {
        containers.push(container);
    }
    let volumes = secrets::volumes(sidecar);
    if !volumes.is_empty() {
        let list = spec
            .entry("volumes")
            .or_insert_with(|| Value::Array(Vec::new()));
        list.as_array_mut()
            .ok_or_else(|| PodError("volumes is not a list".into()))?
            .extend(volumes);
    }
    // The gateway drains for shutdownGraceSeconds after SIGTERM; the pod
    // must wait at least that plus a margin (30 s when unset).
    let grace = termination_grace_period_seconds(sidecar);
    let current = spec
        .get("terminationGracePeriodSeconds")
        .and_then(Value::as_u64);
    if current.is_none_or(|current| current < grace) {
        spec.insert("terminationGracePeriodSeconds".into(), grace.into());
    }
    // fsGroup is a supplemental group of every container: with any fsGroup
    // the gateway (uid 65532) can read the projected token.
    if let Some(fs_group) = sidecar.pod_security_context.get("fsGroup") {
        let context = spec
            .entry("securityContext")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(context) = context.as_object_mut() {
            context.entry("fsGroup").or_insert_with(|| fs_group.clone());
        }
    }
    Ok(())
}

/// The variables the Dapr SDKs read their sidecar's HTTP and gRPC ports
/// from.
pub const DAPR_PORT_VARIABLES: [&str; 2] = ["DAPR_HTTP_PORT", "DAPR_GRPC_PORT"];

/// Points the Dapr SDKs in the pod's containers at the gateway, which
/// serves Dapr's API over HTTP and gRPC on its key API's `port`: each of
/// [`DAPR_PORT_VARIABLES`] that a container does not or may not set itself
/// (see [`may_set`]).
fn set_dapr_ports(spec: &mut Map<String, Value>, port: u16) -> Result<(), PodError> {
    let Some(containers) = spec.get_mut("containers").and_then(Value::as_array_mut) else {
        return Ok(());
    };
    for container in containers.iter_mut().filter_map(Value::as_object_mut) {
        let missing: Vec<&str> = DAPR_PORT_VARIABLES
            .into_iter()
            .filter(|name| !may_set(container, name))
            .collect();
        if missing.is_empty() {
            continue;
        }
        let env = container
            .entry("env")
            .or_insert_with(|| Value::Array(Vec::new()))
            .as_array_mut()
            .ok_or_else(|| PodError("a container's env is not a list".into()))?;
        for name in missing {
            env.push(json!({"name": name, "value": port.to_string()}));
        }
    }
    Ok(())
}

/// Whether `container` sets variable `name` itself, or may: an `env` entry
/// of that name, or an `envFrom` source (ConfigMap or Secret) whose prefix
/// (none by default) begins `name`. The keys of a ConfigMap or Secret are
/// not in the pod spec, and Kubernetes gives `env` priority over `envFrom`:
/// an entry added beside such a source could hide the app's own value.
fn may_set(container: &Map<String, Value>, name: &str) -> bool {
    let list = |key: &str| {
        container
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
    };
    list("env").any(|var| var.get("name").and_then(Value::as_str) == Some(name))
        || list("envFrom").any(|source| {
            let prefix = source.get("prefix").and_then(Value::as_str).unwrap_or("");
            name.starts_with(prefix)
        })
}

/// Whether `container` is the sidecar, as `inject`, the webhook or the
/// chart's sidecar template add it: its name, `args: [serve]` and its
/// admin port.
fn is_sidecar(container: &Value) -> bool {
    container.get("name").and_then(Value::as_str) == Some(CONTAINER_NAME)
        && container.get("args") == Some(&json!(["serve"]))
        && container
            .get("ports")
            .and_then(Value::as_array)
            .is_some_and(|ports| {
                ports
                    .iter()
                    .any(|port| port.get("name").and_then(Value::as_str) == Some(ADMIN_PORT_NAME))
            })
}

/// The names of the volumes `container` mounts.
fn mounted(container: &Value) -> impl Iterator<Item = &str> {
    container
        .get("volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|mount| mount.get("name").and_then(Value::as_str))
}

/// Takes out a sidecar added before: its container and its volumes. An
/// `initContainers` list left empty is removed. A container or volume
/// with the sidecar's names that is not the sidecar's is refused.
fn remove_sidecar(spec: &mut Map<String, Value>) -> Result<(), PodError> {
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|list| spec.get(*list).and_then(Value::as_array))
        .flatten()
        .collect();
    let named = |c: &Value| c.get("name").and_then(Value::as_str) == Some(CONTAINER_NAME);
    if containers.iter().any(|c| named(c) && !is_sidecar(c)) {
        return Err(PodError(format!(
            "the pod already has a container {CONTAINER_NAME} that is not the gateway sidecar \
             (args [serve] and a {ADMIN_PORT_NAME} port); rename it: the name is the sidecar's"
        )));
    }
    let (sidecars, others): (Vec<&Value>, Vec<&Value>) =
        containers.into_iter().partition(|c| is_sidecar(c));
    let sidecar_mounts: Vec<&str> = sidecars.into_iter().flat_map(mounted).collect();
    let other_mounts: Vec<&str> = others.into_iter().flat_map(mounted).collect();
    let volume_names = spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|volume| volume.get("name").and_then(Value::as_str));
    for name in volume_names {
        let theirs = !sidecar_mounts.contains(&name) || other_mounts.contains(&name);
        if is_sidecar_volume(name) && theirs {
            return Err(PodError(format!(
                "the pod already has a volume {name} that is not the gateway sidecar's \
                 (mounted by the sidecar alone); rename it: the name is the sidecar's"
            )));
        }
    }
    for list in ["containers", "initContainers"] {
        if let Some(items) = spec.get_mut(list).and_then(Value::as_array_mut) {
            items.retain(|c| !is_sidecar(c));
        }
    }
    if spec
        .get("initContainers")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty)
    {
        spec.remove("initContainers");
    }
    if let Some(volumes) = spec.get_mut("volumes").and_then(Value::as_array_mut) {
        volumes.retain(|v| {
            !v.get("name")
                .and_then(Value::as_str)
                .is_some_and(is_sidecar_volume)
        });
        if volumes.is_empty() {
            spec.remove("volumes");
        }
    }
    Ok(())
}

/// The chart's `statestore-gateway.terminationGracePeriodSeconds`.
pub fn termination_grace_period_seconds(sidecar: &Sidecar) -> u64 {
    sidecar.gateway.shutdown_grace_seconds + 10
}

/// A probe on the admin port, with the chart's timing fields.
fn probe(path: &str, fields: &Map<String, Value>) -> Value {
    let mut probe = Map::new();
    probe.insert(
        "httpGet".into(),
        json!({"path": path, "port": ADMIN_PORT_NAME}),
    );
    for (key, value) in fields {
        if key != "enabled" {
            probe.insert(key.clone(), value.clone());
        }
    }
    Value::Object(probe)
}

/// The chart's `statestore-gateway.sidecar.container` (not standalone).
pub fn container(sidecar: &Sidecar, native: bool) -> Value {
    let image = &sidecar.image;
    let image_ref = if image.digest.is_empty() {
        format!("{}:{}", image.repository, image.tag)
    } else {
        format!("{}@{}", image.repository, image.digest)
    };
    let mut c = Map::new();
    c.insert("name".into(), CONTAINER_NAME.into());
    c.insert("image".into(), image_ref.into());
    c.insert("imagePullPolicy".into(), image.pull_policy.clone().into());
    c.insert("args".into(), json!(["serve"]));
    if native {
        c.insert("restartPolicy".into(), "Always".into());
    }
    c.insert("env".into(), Value::Array(container_env(sidecar)));
    c.insert(
        "ports".into(),
        json!([{"name": ADMIN_PORT_NAME, "containerPort": sidecar.gateway.admin_port}]),
    );
    let probes = &sidecar.probes;
    c.insert("startupProbe".into(), probe("/livez", &probes.startup));
    c.insert("livenessProbe".into(), probe("/livez", &probes.liveness));
    if probes.readiness.get("enabled") == Some(&Value::Bool(true)) {
        c.insert("readinessProbe".into(), probe("/readyz", &probes.readiness));
    }
    c.insert("resources".into(), sidecar.resources.clone());
    c.insert("securityContext".into(), sidecar.security_context.clone());
    let mounts = secrets::mounts(sidecar);
    if !mounts.is_empty() {
        c.insert("volumeMounts".into(), Value::Array(mounts));
    }
    Value::Object(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sidecar(sets: &[&str]) -> Sidecar {
        Sidecar::with_sets(sets)
    }

    fn names(list: &Value) -> Vec<&str> {
        list.as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn a_deployment_pod_gets_a_plain_sidecar_its_volumes_and_grace() {
        let mut spec = json!({"containers": [{"name": "app", "image": "app"}]});
        add_sidecar(&mut spec, &sidecar(&[])).unwrap();
        assert_eq!(names(&spec["containers"]), ["app", CONTAINER_NAME]);
        assert!(spec.get("initContainers").is_none());
        assert_eq!(
            names(&spec["volumes"]),
            ["statestore-gateway-sat", "statestore-gateway-ca"]
        );
        assert_eq!(spec["terminationGracePeriodSeconds"], 30);
        assert_eq!(spec["securityContext"]["fsGroup"], 65532);
    }

    #[test]
    fn pods_that_run_to_completion_get_a_native_sidecar_first() {
        let mut spec = json!({
            "restartPolicy": "Never",
            "initContainers": [{"name": "migrate", "image": "m"}],
            "containers": [{"name": "job", "image": "j"}],
        });
        add_sidecar(&mut spec, &sidecar(&[])).unwrap();
        assert_eq!(names(&spec["initContainers"]), [CONTAINER_NAME, "migrate"]);
        assert_eq!(spec["initContainers"][0]["restartPolicy"], "Always");
        assert_eq!(names(&spec["containers"]), ["job"]);
    }

    #[test]
    fn injecting_twice_changes_nothing_and_new_settings_replace_old() {
        let mut spec = json!({
            "containers": [{"name": "app"}],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "terminationGracePeriodSeconds": 120,
            "securityContext": {"fsGroup": 1000},
        });
        let plain = sidecar(&[]);
        add_sidecar(&mut spec, &plain).unwrap();
        let once = spec.clone();
        add_sidecar(&mut spec, &plain).unwrap();
        assert_eq!(spec, once);
        assert_eq!(spec["terminationGracePeriodSeconds"], 120);
        assert_eq!(spec["securityContext"]["fsGroup"], 1000);

        let native = sidecar(&["sidecar.native=true", "broker.tls.enabled=false"]);
        add_sidecar(&mut spec, &native).unwrap();
        assert_eq!(names(&spec["containers"]), ["app"]);
        assert_eq!(names(&spec["initContainers"]), [CONTAINER_NAME]);
        assert_eq!(names(&spec["volumes"]), ["data", "statestore-gateway-sat"]);
    }

    #[test]
    fn the_pods_own_container_or_volume_with_the_sidecars_name_is_refused() {
        let plain = sidecar(&[]);
        let mut own_container = json!({"containers": [
            {"name": "app"}, {"name": CONTAINER_NAME, "image": "my/gateway"},
        ]});
        let error = add_sidecar(&mut own_container, &plain).unwrap_err();
        assert!(error.0.contains("container statestore-gateway"), "{error}");
        let mut own_volume = json!({
            "containers": [{"name": "app"}],
            "volumes": [{"name": "statestore-gateway-ca", "emptyDir": {}}],
        });
        let error = add_sidecar(&mut own_volume, &plain).unwrap_err();
        assert!(error.0.contains("volume statestore-gateway-ca"), "{error}");
        // The sidecar's volume, also mounted by the app: not the sidecar's alone.
        let mut shared = json!({"containers": [{"name": "app"}]});
        add_sidecar(&mut shared, &plain).unwrap();
        shared["containers"][0]["volumeMounts"] =
            json!([{"name": "statestore-gateway-ca", "mountPath": "/ca"}]);
        assert!(add_sidecar(&mut shared, &plain).is_err());
        // Names the sidecar never uses are the pod's business.
        let mut other = json!({
            "containers": [{"name": "app"}],
            "volumes": [{"name": "statestore-gateway-data", "emptyDir": {}}],
        });
        add_sidecar(&mut other, &plain).unwrap();
        assert_eq!(
            names(&other["volumes"]),
            [
                "statestore-gateway-data",
                "statestore-gateway-sat",
                "statestore-gateway-ca"
            ]
        );
    }

    fn env_of<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
        container["env"]
            .as_array()?
            .iter()
            .find(|var| var["name"] == name)
            .map(|var| &var["value"])
    }

    #[test]
    fn dapr_ports_point_the_apps_containers_at_the_gateways_port() {
        let mut spec = json!({"containers": [
            {"name": "app"},
            {"name": "own", "env": [{"name": "DAPR_GRPC_PORT", "value": "50001"}]},
        ]});
        add_sidecar(
            &mut spec,
            &sidecar(&["sidecar.daprPorts=true", "gateway.port=9080"]),
        )
        .unwrap();
        let containers = &spec["containers"];
        assert_eq!(names(containers), ["app", "own", CONTAINER_NAME]);
        assert_eq!(
            env_of(&containers[0], "DAPR_HTTP_PORT"),
            Some(&json!("9080"))
        );
        assert_eq!(
            env_of(&containers[0], "DAPR_GRPC_PORT"),
            Some(&json!("9080"))
        );
        // A container's own value stays; the other variable is added.
        assert_eq!(
            env_of(&containers[1], "DAPR_GRPC_PORT"),
            Some(&json!("50001"))
        );
        assert_eq!(
            env_of(&containers[1], "DAPR_HTTP_PORT"),
            Some(&json!("9080"))
        );
        assert_eq!(containers[1]["env"].as_array().unwrap().len(), 2);
        // Not the gateway's own container, and idempotent.
        assert_eq!(env_of(&containers[2], "DAPR_HTTP_PORT"), None);
        let once = spec.clone();
        add_sidecar(
            &mut spec,
            &sidecar(&["sidecar.daprPorts=true", "gateway.port=9080"]),
        )
        .unwrap();
        assert_eq!(spec, once);
    }

    /// The Dapr port variables `add_sidecar` gives each container, by name.
    fn dapr_ports_given(containers: &[Value]) -> Vec<(String, Vec<&str>)> {
        containers
            .iter()
            .map(|container| {
                let given = container["env"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|var| var["value"] == "9080")
                    .filter_map(|var| var["name"].as_str())
                    .collect();
                (container["name"].as_str().unwrap().to_owned(), given)
            })
            .collect()
    }

    #[test]
    fn dapr_ports_leave_what_a_container_may_get_from_env_from() {
        let mut spec = json!({"containers": [
            // The keys of a ConfigMap or Secret are not in the pod spec:
            // without a prefix it may hold either variable.
            {"name": "config-map", "envFrom": [{"configMapRef": {"name": "app"}}]},
            {"name": "secret", "envFrom": [{"secretRef": {"name": "app"}}]},
            // A prefix that begins a variable's name may make it.
            {"name": "dapr-prefix", "envFrom": [{"prefix": "DAPR_", "configMapRef": {"name": "dapr"}}]},
            {"name": "http-prefix", "envFrom": [{"prefix": "DAPR_HTTP_", "secretRef": {"name": "http"}}]},
            {"name": "d-prefix", "envFrom": [{"prefix": "D", "configMapRef": {"name": "d"}}]},
            // Other prefixes cannot.
            {"name": "other-prefix", "envFrom": [
                {"prefix": "APP_", "configMapRef": {"name": "app"}},
                {"prefix": "DAPR_GRPC_PORT_", "secretRef": {"name": "grpc"}},
            ]},
            // An env entry of its own, beside an envFrom that cannot make the other.
            {"name": "both", "env": [{"name": "DAPR_GRPC_PORT", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}],
             "envFrom": [{"prefix": "APP_", "configMapRef": {"name": "app"}}]},
        ]});
        let ports = sidecar(&["sidecar.daprPorts=true", "gateway.port=9080"]);
        add_sidecar(&mut spec, &ports).unwrap();
        let containers = spec["containers"].as_array().unwrap();
        let given = dapr_ports_given(&containers[..containers.len() - 1]);
        let expected: Vec<(String, Vec<&str>)> = [
            ("config-map", vec![]),
            ("secret", vec![]),
            ("dapr-prefix", vec![]),
            ("http-prefix", vec!["DAPR_GRPC_PORT"]),
            ("d-prefix", vec![]),
            ("other-prefix", vec!["DAPR_HTTP_PORT", "DAPR_GRPC_PORT"]),
            ("both", vec!["DAPR_HTTP_PORT"]),
        ]
        .into_iter()
        .map(|(name, vars)| (name.to_owned(), vars))
        .collect();
        assert_eq!(given, expected);
        // A container given nothing keeps no empty env list.
        assert!(containers[0].get("env").is_none(), "{}", containers[0]);
        let once = spec.clone();
        add_sidecar(&mut spec, &ports).unwrap();
        assert_eq!(spec, once);
    }

    #[test]
    fn without_dapr_ports_the_apps_containers_are_left_alone() {
        let mut spec = json!({"containers": [{"name": "app"}]});
        add_sidecar(&mut spec, &sidecar(&[])).unwrap();
        assert!(spec["containers"][0].get("env").is_none(), "{spec}");
    }

    #[test]
    fn a_spec_without_containers_is_refused() {
        for mut bad in [json!({}), json!([]), json!({"containers": {}})] {
            assert!(add_sidecar(&mut bad, &sidecar(&[])).is_err(), "{bad}");
        }
        let mut bad = json!({"containers": [], "initContainers": 3, "restartPolicy": "Never"});
        assert!(add_sidecar(&mut bad, &sidecar(&[])).is_err());
    }
}
