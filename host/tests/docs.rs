//! The project's documentation against the project: every relative link of its Markdown files
//! reaches a file (and a heading, when it names one), every `opentinker` command in their code
//! blocks is one the CLI has, every script they name exists, and `docs/cli.md` is the CLI's own
//! help as it is now (`OPENTINKER_BLESS=1 cargo test --test docs` rewrites it).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use opentinker::cli::Cli;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Markdown files a reader is sent to: the front page and design, the guide, the examples'
/// pages and the crates' READMEs.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut files: Vec<PathBuf> = [
        "README.md",
        "DESIGN.md",
        "sdk/rust/README.md",
        "kernels/README.md",
    ]
    .iter()
    .map(|f| root.join(f))
    .collect();
    for folder in ["docs", "examples"] {
        let mut found: Vec<PathBuf> = std::fs::read_dir(root.join(folder))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        found.sort();
        files.extend(found);
    }
    files
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines of `text` outside fenced code blocks, and those inside them.
fn split_fences(text: &str) -> (Vec<&str>, Vec<&str>) {
    let (mut prose, mut code, mut fenced) = (Vec::new(), Vec::new(), false);
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if fenced {
            code.push(line);
        } else {
            prose.push(line);
        }
    }
    (prose, code)
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    split_fences(text)
        .0
        .iter()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

/// The targets of the inline links `[text](target)` of `line`.
fn link_targets(line: &str) -> Vec<&str> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        targets.push(&after[..end]);
        rest = &after[end..];
    }
    targets
}

#[test]
fn every_relative_link_of_the_docs_reaches_its_file_and_heading() {
    let mut broken = Vec::new();
    for document in documents() {
        let text = read(&document);
        let folder = document.parent().unwrap();
        for line in split_fences(&text).0 {
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, heading) = target.split_once('#').unwrap_or((target, ""));
                let path = if file.is_empty() {
                    document.clone()
                } else {
                    folder.join(file)
                };
                let name = document.strip_prefix(root()).unwrap_or(&document).display();
                if !path.exists() {
                    broken.push(format!("{name}: {target} (no such file)"));
                } else if !heading.is_empty()
                    && path.extension().is_some_and(|e| e == "md")
                    && !anchors(&read(&path)).contains(heading)
                {
                    broken.push(format!("{name}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Whether `before` (the start of a line up to a command) leaves the command in the place of a
/// program: at the start, after environment assignments, or after `--`, `&&`, `;`, `|`, `$(`.
fn in_program_place(before: &str) -> bool {
    let before = before.trim_end();
    before.is_empty()
        || ["--", "&&", ";", "|", "$("]
            .iter()
            .any(|s| before.ends_with(s))
        || before.split_whitespace().all(|word| {
            word.split_once('=').is_some_and(|(name, _)| {
                !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
            })
        })
}

/// The command words after `opentinker` (or `cargo run [--release] --`) on a line of a code
/// block, where it is the program run: the subcommand path, up to the first argument that is
/// not a word.
fn command_words(line: &str) -> Option<Vec<&str>> {
    let prefixes = [
        "cargo run --release -- ",
        "cargo run -- ",
        "target/release/opentinker ",
        "opentinker ",
    ];
    let rest = prefixes.iter().find_map(|prefix| {
        line.match_indices(prefix)
            .find(|(at, _)| in_program_place(&line[..*at]))
            .map(|(at, _)| &line[at + prefix.len()..])
    })?;
    Some(
        rest.split_whitespace()
            .take_while(|w| {
                !w.starts_with('-') && w.chars().all(|c| c.is_ascii_lowercase() || c == '-')
            })
            .collect(),
    )
}

#[test]
fn every_command_in_the_docs_is_one_the_cli_has() {
    let cli = Cli::command();
    let mut unknown = Vec::new();
    for document in documents() {
        let text = read(&document);
        for line in split_fences(&text).1 {
            let Some(words) = command_words(line) else {
                continue;
            };
            let mut command = &cli;
            for word in words {
                if !command.has_subcommands() {
                    break;
                }
                match command.find_subcommand(word) {
                    Some(sub) => command = sub,
                    None => {
                        let name = document.strip_prefix(root()).unwrap_or(&document).display();
                        unknown.push(format!("{name}: `{}`: no command {word:?}", line.trim()));
                        break;
                    }
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "commands the CLI does not have:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn every_script_the_docs_name_exists() {
    let mut missing = Vec::new();
    for document in documents() {
        let text = read(&document);
        for (at, _) in text.match_indices("scripts/") {
            // `scripts/...` itself, not the end of a longer path.
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || matches!(c, '/' | '.' | '-' | '_')) {
                continue;
            }
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || matches!(c, '/' | '.' | '-' | '_'))
                .collect();
            let name = name.trim_end_matches('.');
            let named_file = [".sh", ".py", ".txt"].iter().any(|e| name.ends_with(e));
            if named_file && !root().join(name).exists() {
                let doc = document.strip_prefix(root()).unwrap_or(&document).display();
                missing.push(format!("{doc}: {name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "scripts the docs name that do not exist:\n{}",
        missing.join("\n")
    );
}

/// The CLI reference: each command's long help, the tree walked depth first.
fn cli_reference() -> String {
    let mut out = String::from(
        "# The `opentinker` command line\n\n\
         Each command's `--help`, generated from the command definitions\n\
         (`OPENTINKER_BLESS=1 cargo test --test docs` rewrites this file; a test fails when it is\n\
         stale).\n",
    );
    fn walk(command: &mut clap::Command, path: &str, out: &mut String) {
        let help = command.render_long_help().to_string();
        out.push_str(&format!(
            "\n## `{path}`\n\n```text\n{}\n```\n",
            help.trim_end()
        ));
        let names: Vec<String> = command
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| s.get_name().to_string())
            .collect();
        for name in names {
            if let Some(sub) = command.find_subcommand_mut(&name) {
                walk(sub, &format!("{path} {name}"), out);
            }
        }
    }
    let mut cli = Cli::command().term_width(100);
    cli.build();
    walk(&mut cli, "opentinker", &mut out);
    out
}

#[test]
fn the_cli_reference_is_the_cli_as_it_is() {
    let path = root().join("docs/cli.md");
    let fresh = cli_reference();
    if std::env::var_os("OPENTINKER_BLESS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
        return;
    }
    let kept = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        kept == fresh,
        "docs/cli.md is stale: run `OPENTINKER_BLESS=1 cargo test -p opentinker --test docs` and commit it"
    );
}
