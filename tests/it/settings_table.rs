//! What is written by hand about the settings says what the settings table
//! (`statestore_gateway::settings`) says: the README's configuration
//! tables, and the Helm chart's values, schema, named templates and README.
//! A setting added to the table fails here until each of them follows (or,
//! for the chart, until its row says `Helm::None`).

use std::path::Path;

use serde_json::Value;
use statestore_gateway::settings::{self, Helm, Setting};

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The backticked words of a Markdown table cell.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The rows of the first table after `heading`: (flags, variables, default cell).
fn readme_rows<'a>(readme: &'a str, heading: &str) -> Vec<(Vec<&'a str>, Vec<&'a str>, &'a str)> {
    let section = readme
        .split_once(heading)
        .unwrap_or_else(|| panic!("the README has {heading}"))
        .1;
    section
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .filter(|line| line.starts_with("| `--"))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            (code_spans(cells[1]), code_spans(cells[2]), cells[3])
        })
        .collect()
}

#[test]
fn the_readme_tables_name_every_flag_with_its_variable_and_default() {
    let readme = read("README.md");
    for (heading, rows) in [
        ("### `statestore-gateway serve`", settings::SERVE),
        ("### `statestore-gateway emulator`", settings::EMULATOR),
        ("### `statestore-gateway dev`", settings::DEV),
    ] {
        let documented = readme_rows(&readme, heading);
        for row in rows {
            let (flags, envs, default) = documented
                .iter()
                .find(|(flags, _, _)| flags.contains(&row.flag))
                .unwrap_or_else(|| panic!("{heading}: no README row for {}", row.flag));
            let at = flags.iter().position(|flag| *flag == row.flag).unwrap();
            assert_eq!(envs.get(at), Some(&row.env), "{heading} {}", row.flag);
            // A default written as code is the table's; prose (`none`,
            // `system roots`) is for settings without one.
            let written = code_spans(default);
            if row.default.is_empty() {
                assert!(
                    written.is_empty()
                        || row.flag == "--client-id"
                        || row.flag == "--max-value-bytes",
                    "{heading} {}: the README gives a default the table does not: {default}",
                    row.flag
                );
            } else if written.len() == 1 {
                assert_eq!(written[0], row.default, "{heading} {}: default", row.flag);
            } else {
                panic!(
                    "{heading} {}: the README's default is not `{}`: {default}",
                    row.flag, row.default
                );
            }
        }
        for (flags, _, _) in &documented {
            for flag in flags {
                assert!(
                    rows.iter().any(|row| row.flag == *flag),
                    "{heading}: the README documents {flag}, which is no row of the table"
                );
            }
        }
    }
}

/// The value at a dotted path of a JSON tree.
fn at<'a>(tree: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(tree, |node, key| node.get(key))
}

/// The schema of the value at a dotted path.
fn schema_at<'a>(schema: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(schema, |node, key| node.get("properties")?.get(key))
}

fn chart_rows() -> impl Iterator<Item = (&'static Setting, &'static str)> {
    settings::SERVE
        .iter()
        .chain(settings::SERVE_ENV)
        .copied()
        .filter_map(|row| row.helm.path().map(|path| (row, path)))
}

#[test]
fn the_charts_values_and_schema_hold_every_chart_setting() {
    let values: Value =
        serde_saphyr::from_str(&read("helm/statestore-gateway/values.yaml")).unwrap();
    let schema: Value =
        serde_json::from_str(&read("helm/statestore-gateway/values.schema.json")).unwrap();
    for (row, path) in chart_rows() {
        let value = at(&values, path)
            .unwrap_or_else(|| panic!("values.yaml has no {path} (for {})", row.flag));
        assert!(
            schema_at(&schema, path).is_some(),
            "values.schema.json has no {path} (for {})",
            row.flag
        );
        if let Helm::Default(_) = row.helm {
            let text = match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            assert_eq!(
                text, row.default,
                "values.yaml {path}: {} defaults to {}",
                row.flag, row.default
            );
        }
    }
}

#[test]
fn the_charts_templates_and_readme_name_every_chart_setting() {
    let helpers = read("helm/statestore-gateway/templates/_helpers.tpl");
    let chart_readme = read("helm/statestore-gateway/README.md");
    for (row, path) in chart_rows() {
        assert!(
            helpers.contains(&format!("- name: {}\n", row.env)),
            "the chart's container template sets no {} ({})",
            row.env,
            row.flag
        );
        // `$g.poolSize`, `$v.broker.tls.clientCertSecret`: the path after its section.
        let (_, within) = path.split_once('.').unwrap();
        let (_, last) = path.rsplit_once('.').unwrap();
        assert!(
            helpers.contains(&format!(".{within}")),
            "the chart's container template reads no {path} ({})",
            row.flag
        );
        assert!(
            chart_readme.contains(&format!("`{path}`"))
                || chart_readme.contains(&format!("`.{last}`"))
                || chart_readme.contains(&format!("`.{within}`")),
            "the chart's README does not document {path} ({})",
            row.flag
        );
    }
}

#[test]
fn the_readmes_tracing_section_names_every_variable_without_a_flag() {
    let readme = read("README.md");
    let tracing = readme
        .split_once("## Tracing")
        .expect("the README has ## Tracing")
        .1;
    let tracing = tracing.split("\n## ").next().unwrap();
    for row in settings::SERVE_ENV {
        assert!(
            tracing.contains(&format!("`{}`", row.env)),
            "the README's Tracing section does not name {}",
            row.env
        );
        if !row.default.is_empty() {
            assert!(
                tracing.contains(&format!("`{}`", row.default)),
                "the README's Tracing section does not give {}'s default {}",
                row.env,
                row.default
            );
        }
    }
}
