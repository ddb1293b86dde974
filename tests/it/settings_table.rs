//! What is written by hand about the settings says what the settings table
//! (`statestore_gateway::settings`) says: the configuration tables of
//! docs/configuration.md, and the Helm chart's values, schema, named
//! templates and README. A setting added to the table fails here until each
//! of them follows (or, for the chart, until its row says `Helm::None`).

use std::path::Path;

use serde_json::Value;
use statestore_gateway::settings::{self, Helm, Setting};

/// The page that documents every setting.
const CONFIGURATION: &str = "docs/configuration.md";

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The backticked words of a Markdown table cell.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// One documented row: its names (flags, or variables for a table of
/// variables), variables, default cell and Helm value cell.
struct DocRow<'a> {
    names: Vec<&'a str>,
    envs: Vec<&'a str>,
    default: &'a str,
    helm: Vec<&'a str>,
}

/// The rows of the first table after `heading` whose first cell starts with
/// a code span beginning with `prefix`. Flag tables are `| flag |
/// environment | default | Helm value | |`; variable tables `| variable |
/// default | Helm value | |`.
fn doc_rows<'a>(doc: &'a str, heading: &str, prefix: &str) -> Vec<DocRow<'a>> {
    let section = doc
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("{CONFIGURATION} has {heading}"))
        .1;
    let flags = prefix == "--";
    section
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .filter(|line| line.starts_with(&format!("| `{prefix}")))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let names = code_spans(cells[1]);
            if flags {
                DocRow {
                    names,
                    envs: code_spans(cells[2]),
                    default: cells[3],
                    helm: code_spans(cells[4]),
                }
            } else {
                DocRow {
                    envs: names.clone(),
                    names,
                    default: cells[2],
                    helm: code_spans(cells[3]),
                }
            }
        })
        .collect()
}

/// The Helm cell names the chart value of each setting of its row, and
/// nothing when the chart sets none of them (`—`).
fn check_helm(heading: &str, row: &Setting, documented: &DocRow, settings: &[&Setting]) {
    match row.helm.path() {
        Some(path) => assert!(
            documented.helm.contains(&path),
            "{heading} {}: the Helm value is not `{path}`: {:?}",
            row.env,
            documented.helm
        ),
        None => assert!(
            documented.helm.is_empty(),
            "{heading} {}: the chart does not set it, yet the table names {:?}",
            row.env,
            documented.helm
        ),
    }
    for value in &documented.helm {
        assert!(
            settings
                .iter()
                .any(|setting| setting.helm.path() == Some(value)
                    && documented.envs.contains(&setting.env)),
            "{heading}: `{value}` sets none of {:?}",
            documented.envs
        );
    }
}

#[test]
fn the_configuration_tables_name_every_flag_with_its_variable_default_and_helm_value() {
    let doc = read(CONFIGURATION);
    for (heading, rows) in [
        ("## `statestore-gateway serve`", settings::SERVE),
        ("## `statestore-gateway emulator`", settings::EMULATOR),
        ("## `statestore-gateway dev`", settings::DEV),
        (
            "## `statestore-gateway inject` and `injector`",
            settings::INJECTOR,
        ),
    ] {
        let documented = doc_rows(&doc, heading, "--");
        for row in rows {
            let found = documented
                .iter()
                .find(|found| found.names.contains(&row.flag))
                .unwrap_or_else(|| panic!("{heading}: no row for {}", row.flag));
            let at = found
                .names
                .iter()
                .position(|flag| *flag == row.flag)
                .unwrap();
            assert_eq!(found.envs.get(at), Some(&row.env), "{heading} {}", row.flag);
            // A default written as code is the table's; prose (`none`,
            // `system roots`) is for settings without one.
            let written = code_spans(found.default);
            if row.default.is_empty() {
                assert!(
                    written.is_empty()
                        || row.flag == "--client-id"
                        || row.flag == "--max-value-bytes",
                    "{heading} {}: the page gives a default the table does not: {}",
                    row.flag,
                    found.default
                );
            } else if written.len() == 1 {
                assert_eq!(written[0], row.default, "{heading} {}: default", row.flag);
            } else {
                panic!(
                    "{heading} {}: the page's default is not `{}`: {}",
                    row.flag, row.default, found.default
                );
            }
            check_helm(heading, row, found, rows);
        }
        for found in &documented {
            for flag in &found.names {
                assert!(
                    rows.iter().any(|row| row.flag == *flag),
                    "{heading}: the page documents {flag}, which is no row of the table"
                );
            }
        }
    }
}

#[test]
fn the_opentelemetry_table_names_every_variable_without_a_flag() {
    let doc = read(CONFIGURATION);
    let heading = "## `serve`'s OpenTelemetry variables";
    let documented = doc_rows(&doc, heading, "OTEL_");
    for row in settings::SERVE_ENV {
        let found = documented
            .iter()
            .find(|found| found.envs.contains(&row.env))
            .unwrap_or_else(|| panic!("{heading}: no row for {}", row.env));
        if !row.default.is_empty() {
            assert!(
                code_spans(found.default).contains(&row.default),
                "{heading} {}: the default is not `{}`: {}",
                row.env,
                row.default,
                found.default
            );
        }
        check_helm(heading, row, found, settings::SERVE_ENV);
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
