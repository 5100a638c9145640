//! The shape of the house (issue #34), kept by a test so that it stays: no source file over
//! 600 lines before its unit tests, no function over 100 lines, and every import pointing
//! down the layers that `src/lib.rs` describes. The checks read the source as rustfmt leaves
//! it (a function's closing brace sits alone at the indentation of its `fn`), which
//! `cargo fmt --check` in the test command guarantees.

use std::fs;
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 600;
const MAX_FN_LINES: usize = 100;

fn sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .map(|e| e.expect("directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut out);
    assert!(out.len() > 20, "the walk found the sources: {out:?}");
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The lines before the file's `#[cfg(test)]` module.
fn production_lines(text: &str) -> Vec<&str> {
    text.lines()
        .take_while(|line| line.trim_start() != "#[cfg(test)]" || line.starts_with(' '))
        .collect()
}

/// Each function's name and its length in lines, from `fn` to its closing brace.
fn functions(lines: &[&str]) -> Vec<(String, usize, usize)> {
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let Some(at) = trimmed.find("fn ") else {
            continue;
        };
        let head = &trimmed[..at];
        let is_fn = head.split_whitespace().all(|w| {
            matches!(w, "pub" | "async" | "const" | "unsafe" | "extern") || w.starts_with("pub(")
        });
        if !is_fn || trimmed.ends_with(';') || trimmed.ends_with('}') {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        let name: String = trimmed[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if let Some(end) = lines[start + 1..].iter().position(|l| *l == close) {
            found.push((name, start + 1, end + 2));
        }
    }
    found
}

#[test]
fn no_source_file_is_over_600_lines_before_its_tests() {
    let long: Vec<String> = sources()
        .iter()
        .filter_map(|path| {
            let text = fs::read_to_string(path).expect("read source");
            let n = production_lines(&text).len();
            (n > MAX_FILE_LINES).then(|| format!("{} has {n} lines", relative(path)))
        })
        .collect();
    assert!(long.is_empty(), "split these files:\n{}", long.join("\n"));
}

#[test]
fn no_function_is_over_100_lines() {
    let mut long = Vec::new();
    for path in sources() {
        let text = fs::read_to_string(&path).expect("read source");
        for (name, line, length) in functions(&production_lines(&text)) {
            if length > MAX_FN_LINES {
                long.push(format!(
                    "{}:{line} fn {name} has {length} lines",
                    relative(&path)
                ));
            }
        }
    }
    assert!(
        long.is_empty(),
        "split these functions:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_function_finder_finds_functions_and_measures_them() {
    let text = "impl A {\n    pub(crate) async fn one(\n        x: u8,\n    ) -> u8 {\n        x\n    }\n}\nfn two() {}\nconst fn three() -> u8 {\n    3\n}\n";
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        functions(&lines),
        vec![("one".to_string(), 2, 5), ("three".to_string(), 9, 3)]
    );
}

/// The folders of `src/`, lowest first: a file may import from its own folder and from
/// folders below it, never from one above.
const FLOORS: &[&[&str]] = &[
    &["gcra", "clock", "text"],
    &["observe"],
    &["limits"],
    &["store"],
    &["service", "resp"],
    &["server"],
    &["cli"],
    &["main", "fuzzing"],
];

fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|floor| floor.contains(&module))
}

/// The top-level module a source file belongs to (`src/store/redis/x.rs` -> `store`).
fn module_of(path: &Path) -> String {
    let rel = path
        .strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
        .expect("under src");
    let first = rel.components().next().expect("a component");
    first
        .as_os_str()
        .to_string_lossy()
        .trim_end_matches(".rs")
        .to_string()
}

/// The top-level modules a file names through `crate::` outside its tests.
fn crate_imports(lines: &[&str]) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        let mut rest = *line;
        while let Some(at) = rest.find("crate::") {
            let name: String = rest[at + 7..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.push((i + 1, name));
            rest = &rest[at + 7..];
        }
        let trimmed = line.trim_start();
        if let Some(list) = trimmed.strip_prefix("use crate::{") {
            // One line: `use crate::{a, b::C};`. Several: the names start the lines one
            // level deeper than the `use`, up to `};`.
            let names: Vec<&str> = if list.is_empty() {
                let inner = format!("{}    ", &line[..line.len() - trimmed.len()]);
                lines[i + 1..]
                    .iter()
                    .take_while(|l| l.trim() != "};")
                    .filter_map(|l| l.strip_prefix(inner.as_str()))
                    .filter(|l| !l.starts_with(' '))
                    .collect()
            } else {
                top_level_items(list)
            };
            for name in names {
                let name: String = name
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    found.push((i + 1, name));
                }
            }
        }
    }
    found
}

/// The items of a one-line use list at brace depth zero: `a, b::{C, D}` -> `a`, `b::{C, D}`.
fn top_level_items(list: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (at, c) in list.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&list[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    items.push(&list[start..]);
    items
}

#[test]
fn every_import_points_down_the_layers() {
    let mut upward = Vec::new();
    for path in sources() {
        let from = module_of(&path);
        if from == "lib" {
            continue;
        }
        let Some(own) = floor_of(&from) else {
            panic!("{} is in no floor of FLOORS", relative(&path));
        };
        let text = fs::read_to_string(&path).expect("read source");
        for (line, to) in crate_imports(&production_lines(&text)) {
            if to == "proto" || to == from || to.is_empty() {
                continue;
            }
            match floor_of(&to) {
                Some(floor) if floor <= own => {}
                _ => upward.push(format!("{}:{line} ({from}) imports {to}", relative(&path))),
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that run up the layers:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_core_and_the_leaves_import_nothing_but_the_core() {
    for (file, allowed) in [
        ("src/gcra/mod.rs", &["clock"][..]),
        ("src/gcra/calendar.rs", &["clock"][..]),
        ("src/clock.rs", &[][..]),
        ("src/text.rs", &[][..]),
        ("src/observe/metrics/mod.rs", &["observe", "clock"][..]),
        ("src/observe/metrics/groups.rs", &["observe", "clock"][..]),
        ("src/observe/metrics/ratelimit_keys.rs", &["text"][..]),
        ("src/observe/health.rs", &["observe", "clock"][..]),
    ] {
        let text = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
            .expect("read source");
        for (line, to) in crate_imports(&production_lines(&text)) {
            assert!(
                allowed.contains(&to.as_str()) || to == "proto",
                "{file}:{line} imports crate::{to}"
            );
        }
    }
}
