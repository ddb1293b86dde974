//! `inject` on Kubernetes YAML: every pod template of a stream of
//! documents gets the sidecar; everything else passes through.

use serde_json::{Map, Value};
use thiserror::Error;

use super::pod::{self, PodError};
use super::values::{INJECT_ANNOTATION, SidecarValues, ValuesError};
use super::yaml;

/// Where each kind this knows keeps its pod template (`metadata` and
/// `spec` under that path), by `apiVersion` and `kind`. A kind of another
/// API group (a custom resource that happens to be called `Deployment`) is
/// not one of these.
const POD_TEMPLATES: [(&str, &str, &[&str]); 7] = [
    ("v1", "Pod", &[]),
    ("apps/v1", "Deployment", &["spec", "template"]),
    ("apps/v1", "StatefulSet", &["spec", "template"]),
    ("apps/v1", "DaemonSet", &["spec", "template"]),
    ("apps/v1", "ReplicaSet", &["spec", "template"]),
    ("batch/v1", "Job", &["spec", "template"]),
    (
        "batch/v1",
        "CronJob",
        &["spec", "jobTemplate", "spec", "template"],
    ),
];

/// Why a manifest could not be injected.
#[derive(Debug, Error)]
pub enum InjectError {
    /// The input is not YAML.
    #[error("the input is not valid YAML: {0}")]
    Yaml(String),
    /// The output could not be written as YAML.
    #[error("cannot write YAML: {0}")]
    Write(String),
    /// One object could not take the sidecar.
    #[error("{what}: {message}")]
    Object {
        /// `document 2, Deployment/web`
        what: String,
        /// Why.
        message: String,
    },
}

/// Whether a pod is injected when it says nothing: `inject` injects every
/// pod it is given, the webhook only pods that ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unannotated {
    /// Inject unless `statestore-gateway/inject: disabled`.
    Inject,
    /// Inject only with `statestore-gateway/inject: enabled`.
    Skip,
}

/// Reads a stream of YAML documents, adds the sidecar to every pod
/// template in it (`List` items too), and writes the stream back.
/// Documents are re-serialized in block style: comments are dropped, keys
/// keep their order (new ones follow), and every scalar the sidecar does
/// not change is written as the input wrote it, so that kubectl (YAML 1.1)
/// reads the same value from the output as from the input ([`yaml`]).
pub fn inject_yaml(text: &str, values: &SidecarValues) -> Result<String, InjectError> {
    let nodes = yaml::parse(text).map_err(InjectError::Yaml)?;
    let mut injected = Vec::with_capacity(nodes.len());
    for (index, node) in nodes.iter().enumerate() {
        let mut document = node.to_json();
        inject_object(&mut document, values, Unannotated::Inject).map_err(|(what, message)| {
            InjectError::Object {
                what: format!("document {}{what}", index + 1),
                message,
            }
        })?;
        injected.push(yaml::rebuild(&document, Some(node)));
    }
    yaml::emit(&injected).map_err(InjectError::Write)
}

/// What went wrong and in which object (`, Deployment/web`).
type ObjectError = (String, String);

/// Adds the sidecar to `object`'s pod template, or to each item of a
/// `List`; returns whether anything was injected. Unknown kinds are left
/// as they are.
pub fn inject_object(
    object: &mut Value,
    values: &SidecarValues,
    unannotated: Unannotated,
) -> Result<bool, ObjectError> {
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let what = format!(
        ", {kind}/{}",
        object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("(no name)")
    );
    if api_version == "v1" && kind.ends_with("List") {
        let mut any = false;
        if let Some(items) = object.get_mut("items").and_then(Value::as_array_mut) {
            for (index, item) in items.iter_mut().enumerate() {
                any |= inject_object(item, values, unannotated)
                    .map_err(|(w, m)| (format!("{what}, item {}{w}", index + 1), m))?;
            }
        }
        return Ok(any);
    }
    let Some((_, _, path)) = POD_TEMPLATES
        .iter()
        .find(|(v, k, _)| *v == api_version && *k == kind)
    else {
        return Ok(false);
    };
    // Annotations on the workload, then on its pod template (which wins).
    let mut annotations = annotations_of(object);
    let mut template = &mut *object;
    for key in *path {
        template = template
            .get_mut(*key)
            .ok_or_else(|| (what.clone(), format!("no {} in the object", path.join("."))))?;
    }
    annotations.extend(annotations_of(template));
    let wanted = wants_sidecar(&annotations, unannotated).map_err(|m| (what.clone(), m))?;
    if !wanted {
        return Ok(false);
    }
    let sidecar = values
        .with_annotations(&annotations)
        .and_then(|values| values.sidecar())
        .map_err(|e: ValuesError| (what.clone(), e.to_string()))?;
    let spec = template
        .get_mut("spec")
        .ok_or_else(|| (what.clone(), "the pod template has no spec".to_owned()))?;
    pod::add_sidecar(spec, &sidecar).map_err(|e: PodError| (what.clone(), e.to_string()))?;
    Ok(true)
}

fn annotations_of(object: &Value) -> Map<String, Value> {
    object
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// Reads `statestore-gateway/inject`.
pub fn wants_sidecar(
    annotations: &Map<String, Value>,
    unannotated: Unannotated,
) -> Result<bool, String> {
    match annotations.get(INJECT_ANNOTATION).map(|v| v.as_str()) {
        None => Ok(unannotated == Unannotated::Inject),
        Some(Some("enabled")) => Ok(true),
        Some(Some("disabled")) => Ok(false),
        Some(other) => Err(format!(
            "{INJECT_ANNOTATION} is {}; use enabled or disabled",
            other.map_or_else(|| "not a string".to_owned(), |s| format!("{s:?}"))
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inject(text: &str) -> Result<Vec<Value>, InjectError> {
        let out = inject_yaml(text, &SidecarValues::chart_defaults())?;
        Ok(serde_saphyr::from_multiple(&out).unwrap())
    }

    fn container_names(spec: &Value) -> Vec<&str> {
        ["initContainers", "containers"]
            .iter()
            .filter_map(|list| spec.get(*list).and_then(Value::as_array))
            .flatten()
            .map(|c| c["name"].as_str().unwrap())
            .collect()
    }

    const DEPLOYMENT: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n\
        spec:\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n\
        \x20   spec:\n      containers: [{name: web, image: nginx}]\n";

    #[test]
    fn every_listed_kind_gets_the_sidecar() {
        let pod = "containers: [{name: app, image: app}]";
        let docs = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec: {{{pod}}}\n---\n{DEPLOYMENT}---\n\
             apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: s}}\nspec: {{template: {{spec: {{{pod}}}}}}}\n---\n\
             apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {{name: d}}\nspec: {{template: {{spec: {{{pod}}}}}}}\n---\n\
             apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {{name: r}}\nspec: {{template: {{spec: {{{pod}}}}}}}\n---\n\
             apiVersion: batch/v1\nkind: Job\nmetadata: {{name: j}}\nspec: {{template: {{spec: {{restartPolicy: Never, {pod}}}}}}}\n---\n\
             apiVersion: batch/v1\nkind: CronJob\nmetadata: {{name: c}}\nspec: {{jobTemplate: {{spec: {{template: {{spec: {{restartPolicy: OnFailure, {pod}}}}}}}}}}}\n"
        );
        let out = inject(&docs).unwrap();
        assert_eq!(out.len(), 7);
        let specs = [
            "/spec",
            "/spec/template/spec",
            "/spec/template/spec",
            "/spec/template/spec",
            "/spec/template/spec",
            "/spec/template/spec",
            "/spec/jobTemplate/spec/template/spec",
        ];
        for (doc, path) in out.iter().zip(specs) {
            let spec = doc.pointer(path).unwrap();
            let names = container_names(spec);
            assert!(names.contains(&pod::CONTAINER_NAME), "{doc}");
        }
        // Jobs: the sidecar is native, so the job can complete.
        assert_eq!(
            out[5].pointer("/spec/template/spec/initContainers/0/name"),
            Some(&Value::from(pod::CONTAINER_NAME))
        );
    }

    #[test]
    fn lists_unknown_kinds_and_disabled_workloads() {
        let text = format!(
            "apiVersion: v1\nkind: List\nitems:\n- {}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c}}\ndata: {{a: '1'}}\n---\n\
             apiVersion: example.com/v1\nkind: Deployment\nmetadata: {{name: custom}}\nspec: {{template: {{spec: {{containers: []}}}}}}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {{name: off, annotations: {{statestore-gateway/inject: disabled}}}}\nspec: {{containers: [{{name: a}}]}}\n",
            serde_json::to_string(&serde_saphyr::from_str::<Value>(DEPLOYMENT).unwrap()).unwrap()
        );
        let input: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        let out = inject(&text).unwrap();
        assert!(
            container_names(out[0].pointer("/items/0/spec/template/spec").unwrap())
                .contains(&pod::CONTAINER_NAME)
        );
        assert_eq!(out[1..], input[1..]);
    }

    #[test]
    fn inject_is_idempotent() {
        let once = inject_yaml(DEPLOYMENT, &SidecarValues::chart_defaults()).unwrap();
        let twice = inject_yaml(&once, &SidecarValues::chart_defaults()).unwrap();
        assert_eq!(once, twice);
    }

    #[test]
    fn template_annotations_set_values_and_bad_ones_name_the_object() {
        let text = DEPLOYMENT.replace(
            "metadata: {labels: {app: web}}",
            "metadata: {labels: {app: web}, annotations: {statestore-gateway/sidecar.native: 'true'}}",
        );
        let out = inject(&text).unwrap();
        assert_eq!(
            out[0].pointer("/spec/template/spec/initContainers/0/name"),
            Some(&Value::from(pod::CONTAINER_NAME))
        );
        let dapr = DEPLOYMENT.replace(
            "metadata: {labels: {app: web}}",
            "metadata: {labels: {app: web}, annotations: {statestore-gateway/sidecar.daprPorts: 'true'}}",
        );
        let out = inject(&dapr).unwrap();
        assert_eq!(
            out[0].pointer("/spec/template/spec/containers/0/env"),
            Some(&serde_json::json!([
                {"name": "DAPR_HTTP_PORT", "value": "8080"},
                {"name": "DAPR_GRPC_PORT", "value": "8080"},
            ]))
        );
        for (bad, says) in [
            (
                DEPLOYMENT.replace(
                    "metadata: {name: web}",
                    "metadata: {name: web, annotations: {statestore-gateway/inject: 'yes'}}",
                ),
                "use enabled or disabled",
            ),
            (
                DEPLOYMENT.replace(
                    "metadata: {name: web}",
                    "metadata: {name: web, annotations: {statestore-gateway/gateway.port: 'x'}}",
                ),
                "statestore-gateway/gateway.port",
            ),
            (DEPLOYMENT.replace("containers:", "pods:"), "no containers"),
        ] {
            let error = inject(&bad).unwrap_err().to_string();
            assert!(error.contains("document 1, Deployment/web"), "{error}");
            assert!(error.contains(says), "{error}");
        }
        let error = inject("a: [1, 2\nb: c").unwrap_err().to_string();
        assert!(error.contains("not valid YAML"), "{error}");
    }
}
