//! The module graph of `src/` has no cycle, and the data path's layers
//! only import downward.
//!
//! Each file is a module; it depends on every module its non-test code
//! names through `crate::`, `super::` or a child module's name. A name a
//! parent re-exports (`pub use child::Name`) counts as the child's. Doc
//! comments and `#[cfg(test)] mod` blocks do not count. This is what
//! `cargo modules dependencies --acyclic` checks, without building a
//! rust-analyzer for CI.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The data path, top to bottom: a module may import the ones after it,
/// never one before it.
const LAYERS: [&str; 9] = [
    "cli", "http", "access", "dapr", "locks", "watch", "store", "mqtt", "protocol",
];

/// A module: its path (`http::keys`; the crate root is empty) and code.
struct Module {
    path: Vec<String>,
    code: String,
    /// `pub use child::{A, B}`: name -> the child module it comes from.
    reexports: BTreeMap<String, String>,
}

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            source_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The code without comments and without its `#[cfg(test)] mod` (at the
/// bottom, by the project's style).
fn code_of(text: &str) -> String {
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]")
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            break;
        }
        let without_comment = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        code.push_str(without_comment);
        code.push('\n');
    }
    code
}

fn modules() -> Vec<Module> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&root, &mut files);
    files
        .into_iter()
        .filter(|file| file.file_name().is_some_and(|name| name != "main.rs"))
        .map(|file| {
            let relative = file.strip_prefix(&root).unwrap().with_extension("");
            let mut path: Vec<String> = relative
                .components()
                .map(|part| part.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(path.last().map(String::as_str), Some("mod" | "lib")) {
                path.pop();
            }
            let code = code_of(&std::fs::read_to_string(&file).unwrap());
            let reexports = reexports(&code);
            Module {
                path,
                code,
                reexports,
            }
        })
        .collect()
}

/// `pub use child::Name;` and `pub use child::{A, B};`.
fn reexports(code: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for statement in code.split(';') {
        // Attributes (`#[cfg(...)]`) may come first.
        let Some(at) = statement.find("pub use ") else {
            continue;
        };
        let rest = &statement[at + "pub use ".len()..];
        let Some((child, items)) = rest.split_once("::") else {
            continue;
        };
        if child == "crate" || child == "super" {
            continue;
        }
        let items = items.trim().trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            let name = item.trim().rsplit("::").next().unwrap_or_default().trim();
            if !name.is_empty() {
                names.insert(name.to_owned(), child.to_owned());
            }
        }
    }
    names
}

fn is_ident(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// Every path the code names: `crate::a::b`, `super::x`, `child::y`,
/// with `use` groups (`a::{b, c::d}`) expanded one level.
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let mut paths = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let starts_ident = is_ident(bytes[at]) && (at == 0 || !is_ident(bytes[at - 1]));
        let after_colons = at >= 2 && &bytes[at - 2..at] == b"::";
        if !starts_ident || after_colons {
            at += 1;
            continue;
        }
        let mut segments = Vec::new();
        let mut end = at;
        loop {
            let start = end;
            while end < bytes.len() && is_ident(bytes[end]) {
                end += 1;
            }
            segments.push(code[start..end].to_owned());
            if code[end..].starts_with("::") && end + 2 < bytes.len() {
                if bytes[end + 2] == b'{' {
                    let close = code[end..].find('}').map_or(bytes.len(), |i| end + i);
                    for item in code[end + 3..close].split(',') {
                        let mut grouped = segments.clone();
                        grouped.extend(
                            item.split("::")
                                .map(|part| part.trim().to_owned())
                                .filter(|part| !part.is_empty() && part != "self"),
                        );
                        paths.push(grouped);
                    }
                    end = close;
                    segments.clear();
                    break;
                }
                if is_ident(bytes[end + 2]) {
                    end += 2;
                    continue;
                }
            }
            break;
        }
        if segments.len() > 1 {
            paths.push(segments);
        }
        at = end.max(at + 1);
    }
    paths
}

/// The module graph: module -> the modules it names.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules();
    let known: BTreeMap<Vec<String>, &Module> = modules
        .iter()
        .map(|module| (module.path.clone(), module))
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for module in &modules {
        let targets = graph.entry(module.path.join("::")).or_default();
        for path in named_paths(&module.code) {
            let absolute: Vec<String> = match path[0].as_str() {
                "crate" => path[1..].to_vec(),
                "super" => {
                    let mut base = module.path.clone();
                    let mut rest = &path[..];
                    while rest.first().is_some_and(|part| part == "super") {
                        base.pop();
                        rest = &rest[1..];
                    }
                    base.extend(rest.iter().cloned());
                    base
                }
                // A child module named by its bare name.
                child => {
                    let mut candidate = module.path.clone();
                    candidate.push(child.to_owned());
                    if !known.contains_key(&candidate) {
                        continue;
                    }
                    candidate.extend(path[1..].iter().cloned());
                    candidate
                }
            };
            // The longest prefix that is a module, through one re-export.
            let Some(length) = (0..=absolute.len())
                .rev()
                .find(|length| known.contains_key(&absolute[..*length]))
            else {
                continue;
            };
            let mut target = absolute[..length].to_vec();
            if let Some(name) = absolute.get(length)
                && let Some(child) = known[&target].reexports.get(name)
            {
                target.push(child.clone());
            }
            // The crate root only declares modules: naming it is no edge.
            if target != module.path && !target.is_empty() && known.contains_key(&target) {
                targets.insert(target.join("::"));
            }
        }
    }
    graph
}

/// A cycle, if the graph has one (depth-first search).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|seen| seen == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

fn top_level(module: &str) -> &str {
    module.split("::").next().unwrap_or_default()
}

#[test]
fn the_module_graph_has_no_cycle() {
    let graph = graph();
    assert!(graph.len() > 20, "too few modules found: {graph:?}");
    // The checker sees real edges (keys names the store client).
    assert!(graph["http::api::keys"].contains("store"), "{graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!("module cycle: {}", cycle.join(" -> "));
    }
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in &graph {
        for to in targets {
            if top_level(from) != top_level(to) && !from.is_empty() && !to.is_empty() {
                top.entry(top_level(from).to_owned())
                    .or_default()
                    .insert(top_level(to).to_owned());
            }
        }
    }
    if let Some(cycle) = find_cycle(&top) {
        panic!("top-level module cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_data_path_imports_only_downward() {
    let graph = graph();
    for (from, targets) in &graph {
        let Some(from_layer) = LAYERS.iter().position(|layer| *layer == top_level(from)) else {
            continue;
        };
        for to in targets {
            if let Some(to_layer) = LAYERS.iter().position(|layer| *layer == top_level(to)) {
                assert!(
                    to_layer >= from_layer,
                    "{from} imports {to}, a layer above it ({})",
                    LAYERS.join(" -> ")
                );
            }
        }
    }
}

#[test]
fn the_checker_reads_paths_groups_and_reexports() {
    let code = "use crate::a::{b, c::D};\nuse super::X;\nlet y = child::f();\n";
    let paths = named_paths(code);
    assert!(paths.contains(&vec!["crate".into(), "a".into(), "b".into()]));
    assert!(paths.contains(&vec!["crate".into(), "a".into(), "c".into(), "D".into()]));
    assert!(paths.contains(&vec!["super".into(), "X".into()]));
    assert!(paths.contains(&vec!["child".into(), "f".into()]));
    let reexported = reexports("pub use pool::{Pool, PoolError};\npub use auth::ConfigError;");
    assert_eq!(reexported["PoolError"], "pool");
    assert_eq!(reexported["ConfigError"], "auth");
    let cyclic = BTreeMap::from([
        ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
        ("b".to_owned(), BTreeSet::from(["a".to_owned()])),
    ]);
    assert!(find_cycle(&cyclic).is_some());
    let acyclic = BTreeMap::from([("a".to_owned(), BTreeSet::from(["b".to_owned()]))]);
    assert!(find_cycle(&acyclic).is_none());
}
