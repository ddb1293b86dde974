//! The README, BENCHMARKS.md and the pages of docs/ point at things that
//! exist: every relative link at a file (and a heading of it, when it names
//! one), every repository path written as code at a file or directory, and
//! every test named as code (`faults::sigterm_...`) at a function. And the
//! README and BENCHMARKS.md stay short, the reference pages open with their
//! contents.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files a user reads: the README, BENCHMARKS.md, docs/*.md.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md"), root().join("BENCHMARKS.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn name(path: &Path) -> String {
    path.strip_prefix(root()).unwrap().display().to_string()
}

/// The text outside fenced code blocks.
fn prose(text: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The code spans of the prose.
fn code_spans(prose: &str) -> Vec<&str> {
    prose.split('`').skip(1).step_by(2).collect()
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, and every
/// character but letters, digits, `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .lines()
        .filter_map(|line| line.strip_prefix('#'))
        .map(|heading| anchor(heading.trim_start_matches('#')))
        .collect()
}

/// The targets of the inline links `[text](target)` of the prose.
fn links(prose: &str) -> Vec<&str> {
    prose
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(target, _)| target))
        .collect()
}

#[test]
fn every_link_in_the_docs_leads_to_a_file_and_heading() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = read(&page);
        for target in links(&prose(&text)) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, heading) = target.split_once('#').unwrap_or((target, ""));
            let file = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !file.exists() {
                broken.push(format!("{}: {target} (no such file)", name(&page)));
            } else if !heading.is_empty() && !anchors(&read(&file)).contains(heading) {
                broken.push(format!("{}: {target} (no such heading)", name(&page)));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Where repository paths start.
const TOP: &[&str] = &[
    "src/", "tests/", "scripts/", "helm/", "deploy/", "docs/", "benches/", "fuzz/", ".ci/",
    ".cargo/",
];

#[test]
fn every_repository_path_the_docs_name_exists() {
    let mut missing = Vec::new();
    for page in pages() {
        let text = prose(&read(&page));
        for span in code_spans(&text) {
            // `scripts/bench --only keys`: the path is the first word.
            let path = span.split_whitespace().next().unwrap_or_default();
            if TOP.iter().any(|top| path.starts_with(top))
                && !path.contains(['<', '*', '$'])
                && !root().join(path).exists()
            {
                missing.push(format!("{}: {path}", name(&page)));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths that do not exist:\n{}",
        missing.join("\n")
    );
}

/// Every `fn` name of the crate's sources and tests.
fn functions() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut dirs = vec![root().join("src"), root().join("tests")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                for rest in read(&path).split("fn ").skip(1) {
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    names.insert(name);
                }
            }
        }
    }
    names
}

#[test]
fn every_test_the_docs_name_exists() {
    let functions = functions();
    let mut missing = Vec::new();
    let mut named = 0;
    for page in pages() {
        let text = prose(&read(&page));
        for span in code_spans(&text) {
            // `module::test_name`, lower case: a test (or a function).
            let Some((module, function)) = span.rsplit_once("::") else {
                continue;
            };
            let lower = |s: &str| {
                !s.is_empty()
                    && s.chars().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == ':'
                    })
            };
            if !lower(module) || !lower(function) || !function.contains('_') {
                continue;
            }
            named += 1;
            if !functions.contains(function) {
                missing.push(format!("{}: {span}", name(&page)));
            }
        }
    }
    assert!(
        named >= 50,
        "only {named} tests named: is the check still reading the docs?"
    );
    assert!(
        missing.is_empty(),
        "tests named in the docs that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_front_pages_stay_short_and_long_pages_open_with_their_contents() {
    for (page, most) in [("README.md", 300), ("BENCHMARKS.md", 350)] {
        let lines = read(&root().join(page)).lines().count();
        assert!(
            lines <= most,
            "{page} has {lines} lines, more than {most}: reference belongs in docs/"
        );
    }
    // The README is the short front door; the reference pages are long.
    for page in pages().into_iter().skip(1) {
        let text = prose(&read(&page));
        if text.matches("\n## ").count() < 3 {
            continue;
        }
        let before_first_section = text.split("\n## ").next().unwrap();
        assert!(
            before_first_section.contains("](#"),
            "{} has sections but no contents list before the first",
            name(&page)
        );
    }
}
