//! The shape of the house (issue #34), kept by a test so that it stays: no source file over
//! 600 lines counting its unit tests (#59), no function over 100 lines, and every import pointing
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
    for root in crate_roots() {
        walk(&root, &mut out);
    }
    assert!(out.len() > 20, "the walk found the sources: {out:?}");
    out
}

/// The `src/` folder of every crate of the workspace but the tests' support crate: the
/// service's own (`src/`) and the floors' (`crates/*/src/`).
fn crate_roots() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut roots = vec![root.join("src")];
    let mut crates: Vec<PathBuf> = fs::read_dir(root.join("crates"))
        .expect("read crates/")
        .map(|e| e.expect("directory entry").path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    crates.sort();
    assert!(!crates.is_empty(), "the floors' crates were found");
    roots.extend(crates);
    roots
}

/// A source file's path under its crate's `src/` (`crates/core/src/gcra/mod.rs` ->
/// `gcra/mod.rs`).
fn in_crate(path: &Path) -> &Path {
    let src = path
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "src"))
        .expect("under a src/ folder");
    path.strip_prefix(src).expect("under its src/")
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

/// Counting its unit tests (issue #59): a concept's tests live beside its code, so a file
/// that outgrows the cap is split along its concepts, tests and all.
#[test]
fn no_source_file_is_over_600_lines() {
    let long: Vec<String> = sources()
        .iter()
        .filter_map(|path| {
            let text = fs::read_to_string(path).expect("read source");
            let n = text.lines().count();
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
    &["alloc", "gcra", "clock", "text", "cell", "redis_gcra"],
    &["observe"],
    &["limits"],
    &["store"],
    &["grpc"],
    &["service", "resp"],
    &["server"],
    &["cli"],
    &["main", "fuzzing", "module"],
];

fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|floor| floor.contains(&module))
}

/// The crates of `crates/` whose top-level modules are floors of their own, re-exported at
/// the root of `cellrate` as they are: the core (`gcra`, `clock`, `text`) and the service
/// (`grpc`, `service`, `resp`, `proto`).
const CRATES_OF_FLOORS: [&str; 2] = ["core", "service"];

/// The floor a crate of `crates/` is, by its folder's name (`crates/limits/src/x.rs` ->
/// `limits`), for every crate but those of `CRATES_OF_FLOORS`.
fn floor_crate(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(env!("CARGO_MANIFEST_DIR")).ok()?;
    let mut parts = rel.components().map(|c| c.as_os_str().to_string_lossy());
    match (parts.next()?.as_ref(), parts.next()?.as_ref()) {
        ("crates", name) if CRATES_OF_FLOORS.contains(&name) => None,
        ("crates", name) => Some(name.to_string()),
        _ => None,
    }
}

/// The top-level module a source file belongs to (`src/store/redis/x.rs` -> `store`,
/// `crates/limits/src/ids.rs` -> `limits`).
fn module_of(path: &Path) -> String {
    if let Some(floor) = floor_crate(path) {
        return floor;
    }
    let rel = in_crate(path);
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

/// The floors a file names through another crate of the workspace: `cellrate_core::gcra`
/// -> `gcra`, `cellrate_limits::names` -> `limits`.
fn crate_dependencies(lines: &[&str]) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        let mut rest = *line;
        while let Some(at) = rest.find("cellrate_") {
            let ident = |c: &char| c.is_alphanumeric() || *c == '_';
            let krate: String = rest[at + 9..].chars().take_while(ident).collect();
            rest = &rest[at + 9 + krate.len()..];
            // A crate path, not a word that starts the same (`cellrate_requests_total`).
            let Some(path) = rest.strip_prefix("::") else {
                continue;
            };
            let module: String = path.chars().take_while(ident).collect();
            found.push((
                i + 1,
                if CRATES_OF_FLOORS.contains(&krate.as_str()) {
                    module
                } else {
                    krate
                },
            ));
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
        let lines = production_lines(&text);
        let own_crate = floor_crate(&path).is_some();
        let imports = crate_imports(&lines)
            .into_iter()
            .filter(|_| !own_crate)
            .chain(crate_dependencies(&lines));
        for (line, to) in imports {
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
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (file, allowed) in [
        ("crates/core/src/gcra/mod.rs", &["clock"][..]),
        ("crates/core/src/gcra/calendar.rs", &["clock"][..]),
        ("crates/core/src/gcra/bucket.rs", &["clock"][..]),
        ("crates/core/src/clock.rs", &[][..]),
        ("crates/core/src/text.rs", &[][..]),
    ] {
        let text = fs::read_to_string(root.join(file)).expect("read source");
        for (line, to) in crate_imports(&production_lines(&text)) {
            assert!(
                allowed.contains(&to.as_str()) || to == "proto",
                "{file}:{line} imports crate::{to}"
            );
        }
    }
    // The leaves (cellrate-observe) name no crate of the workspace but the core, in their
    // sources and in their manifest.
    let leaves = root.join("crates/observe");
    let mut read = 0;
    for path in sources().iter().filter(|p| p.starts_with(&leaves)) {
        read += 1;
        let text = fs::read_to_string(path).expect("read source");
        for (line, to) in crate_dependencies(&production_lines(&text)) {
            assert!(
                ["gcra", "clock", "text"].contains(&to.as_str()),
                "{}:{line} names cellrate's {to}",
                relative(path)
            );
        }
    }
    assert!(read >= 8, "the leaves' files were read: {read}");
    let manifest = fs::read_to_string(leaves.join("Cargo.toml")).expect("read manifest");
    let ours: Vec<&str> = manifest
        .lines()
        .filter(|l| l.starts_with("cellrate"))
        .collect();
    assert_eq!(ours, ["cellrate-core = { path = \"../core\" }"]);
}

/// A source file's module path: `src/store/redis/sentinel.rs` -> `store::redis::sentinel`,
/// `src/service/native/mod.rs` -> `service::native`, `src/lib.rs` -> the root, and a floor
/// crate's files under its floor's name (`crates/limits/src/ids.rs` -> `limits::ids`).
fn module_path(path: &Path) -> Vec<String> {
    let rel = in_crate(path);
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    floor_crate(path).into_iter().chain(parts).collect()
}

/// Every module path a file's production lines name through `crate::`, `super::` or
/// `self::` (a `use` list's items each), made absolute.
fn named_paths(own: &[String], root: &[String], lines: &[&str]) -> Vec<Vec<String>> {
    let text: String = lines
        .iter()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| format!("{} ", l.trim()))
        .collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = Vec::new();
    let bytes = text.as_str();
    let mut at = 0;
    while let Some(next) = ["crate::", "super::", "self::"]
        .iter()
        .filter_map(|p| bytes[at..].find(p).map(|i| at + i))
        .min()
    {
        at = next + 1;
        if next > 0 && bytes[..next].ends_with(|c: char| ident(c) || c == ':') {
            continue;
        }
        // Walk `super::super::a::b` or `crate::a::{b, c::d}` from here.
        let mut base: Vec<String> = Vec::new();
        let mut rest = &bytes[next..];
        let mut first = true;
        loop {
            let word: String = rest.chars().take_while(|&c| ident(c)).collect();
            match (first, word.as_str()) {
                (true, "crate") => base = root.to_vec(),
                (true, "self") => base = own.to_vec(),
                (_, "super") if first || base.len() < own.len() => {
                    if first {
                        base = own.to_vec();
                    }
                    base.pop();
                }
                (false, w) if !w.is_empty() => base.push(w.to_string()),
                _ => break,
            }
            first = false;
            rest = &rest[word.len()..];
            if let Some(r) = rest.strip_prefix("::{") {
                let list: String = r.chars().take_while(|&c| c != '}').collect();
                for item in list.split(',') {
                    let mut path = base.clone();
                    path.extend(item.trim().split("::").map(|s| s.trim().to_string()));
                    found.push(path);
                }
                break;
            }
            match rest.strip_prefix("::") {
                Some(r) => rest = r,
                None => break,
            }
        }
        found.push(base);
    }
    found
}

/// No two modules of one folder import each other (issue #48): with both directions, a
/// change to either ripples back into it, and neither can be read or tested alone.
/// Sibling modules are files or folders under one parent; an import counts from anywhere in
/// a module's folder. (Names reached through a re-export of the parent are not followed.)
#[test]
fn no_two_modules_of_a_folder_import_each_other() {
    let files: Vec<(Vec<String>, Vec<Vec<String>>)> = sources()
        .into_iter()
        .filter(|p| !p.ends_with("src/main.rs"))
        .map(|p| {
            let own = module_path(&p);
            let text = fs::read_to_string(&p).expect("read source");
            let root: Vec<String> = floor_crate(&p).into_iter().collect();
            let named = named_paths(&own, &root, &production_lines(&text));
            (own, named)
        })
        .collect();
    let mut modules: Vec<Vec<String>> = files
        .iter()
        .flat_map(|(own, _)| (1..=own.len()).map(|n| own[..n].to_vec()))
        .collect();
    modules.sort();
    modules.dedup();
    let imports = |from: &[String], to: &[String]| {
        files.iter().any(|(own, named)| {
            own.starts_with(from)
                && named
                    .iter()
                    .any(|n| n.starts_with(to) && !n.starts_with(from))
        })
    };
    let mut cycles = Vec::new();
    for (i, a) in modules.iter().enumerate() {
        for b in &modules[i + 1..] {
            let siblings = a.len() == b.len() && a[..a.len() - 1] == b[..b.len() - 1];
            if siblings && imports(a, b) && imports(b, a) {
                cycles.push(format!("{} <-> {}", a.join("::"), b.join("::")));
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "modules that import each other:\n{}",
        cycles.join("\n")
    );
}

/// The front ends under `service/` (Envoy's RLS, the native API, RLQS) import no other
/// front end (issue #59): what two of them share lives below them, in the decision
/// service (`service::Decider`) or in a domain room such as `service::settle`, which in
/// turn imports no front end.
#[test]
fn no_front_end_imports_another() {
    const FRONT_ENDS: [&str; 3] = ["envoy", "native", "rlqs"];
    let mut found = Vec::new();
    let mut read = 0;
    for path in sources() {
        let own = module_path(&path);
        let room = match own.as_slice() {
            [service, room, ..] if service == "service" => room.clone(),
            _ => continue,
        };
        if !FRONT_ENDS.contains(&room.as_str()) && room != "settle" {
            continue;
        }
        read += 1;
        let text = fs::read_to_string(&path).expect("read source");
        for named in named_paths(&own, &[], &production_lines(&text)) {
            if let [service, other, ..] = named.as_slice() {
                if service == "service" && *other != room && FRONT_ENDS.contains(&other.as_str()) {
                    found.push(format!("{} imports service::{other}", relative(&path)));
                }
            }
        }
    }
    assert!(read > 20, "the front ends' files were read: {read}");
    found.dedup();
    assert!(
        found.is_empty(),
        "front ends that import another:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_path_reader_makes_paths_absolute() {
    let own: Vec<String> = ["service", "envoy", "decide"].map(String::from).to_vec();
    let lines = [
        "use super::batch::{descriptor_digest, Batch};",
        "use super::super::store::StoreError;",
        "    crate::limits::names::BucketKey::new(1, \"\")",
        "// use super::commented::Out;",
    ];
    let named: Vec<String> = named_paths(&own, &[], &lines)
        .iter()
        .map(|p| p.join("::"))
        .collect();
    assert!(
        named.contains(&"service::envoy::batch::descriptor_digest".to_string()),
        "{named:?}"
    );
    assert!(
        named.contains(&"service::store::StoreError".to_string()),
        "{named:?}"
    );
    assert!(
        named.contains(&"limits::names::BucketKey::new".to_string()),
        "{named:?}"
    );
    assert!(!named.iter().any(|n| n.contains("commented")), "{named:?}");
}

/// The fast tier (`tests/it/`, target `it`) needs nothing but Rust: none of its modules
/// starts what the full tier (`tests/full/`, target `full`) needs (redis-server, Valkey,
/// Envoy, Helm, Prometheus, grpcurl, Python, redis-cell, memcached). The harness both share,
/// `tests/support/` (`common`), is where those tools are started.
#[test]
fn the_fast_tier_starts_no_tool() {
    let tools = [
        "redis_server::",
        "redis_cell::",
        "RedisServer",
        "RedisCluster",
        "memcached::",
        "Memcached::",
        "common::envoy::",
        "Envoy::start",
        "CELLRATE_TEST_ENVOY",
        "CELLRATE_TEST_VALKEY",
        "CELLRATE_TEST_HELM",
        "CELLRATE_TEST_PYTHON",
        "Command::new(\"grpcurl\")",
        "Command::new(\"prometheus\")",
        "Command::new(\"promtool\")",
        "Command::new(\"redis-",
        "Command::new(\"python3\")",
        "Command::new(\"helm\")",
    ];
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it");
    let mut found = Vec::new();
    let mut modules = 0;
    for entry in fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        // This file names the tools.
        let exempt = ["structure.rs"];
        let shared = path
            .file_name()
            .is_some_and(|n| exempt.iter().any(|e| n == *e));
        if path.extension().is_none_or(|e| e != "rs") || shared {
            continue;
        }
        modules += 1;
        let text = fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            for tool in tools.iter().filter(|tool| line.contains(*tool)) {
                found.push(format!("{}:{}: {tool}", relative(&path), n + 1));
            }
        }
    }
    assert!(modules > 20, "the fast tier's modules were read: {modules}");
    assert!(
        found.is_empty(),
        "move these tests to tests/full/: {found:#?}"
    );
}

/// The files a `lib.rs`'s map names: the first word of each line of its `text` block that
/// names a file (ends in `.rs`; a room's heading ends in `/`, a description's second line
/// starts with a plain word).
fn files_the_map_names(lib: &str) -> Vec<String> {
    let block = lib
        .split("//! ```text\n")
        .nth(1)
        .and_then(|rest| rest.split("//! ```\n").next())
        .expect("src/lib.rs has a ```text map");
    let mut named: Vec<String> = block
        .lines()
        .filter_map(|line| line.strip_prefix("//!")?.split_whitespace().next())
        .filter(|word| word.ends_with(".rs"))
        .map(str::to_string)
        .collect();
    named.sort();
    named
}

/// The map in each crate's `lib.rs` is the one description of its shape: it names every
/// source file of the crate, and no file that is not there (a renamed file cannot leave a
/// stale name).
#[test]
fn the_map_in_each_lib_rs_names_every_file_and_no_other() {
    let all = sources();
    for root in crate_roots() {
        let lib = fs::read_to_string(root.join("lib.rs")).unwrap();
        let named = files_the_map_names(&lib);
        let mut files: Vec<String> = (all.iter())
            .filter(|p| p.starts_with(&root))
            .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
            .collect();
        files.sort();
        let missing: Vec<_> = files.iter().filter(|f| !named.contains(f)).collect();
        let stale: Vec<_> = named.iter().filter(|n| !files.contains(n)).collect();
        let at = relative(&root);
        assert!(
            missing.is_empty(),
            "{at}: files the map does not name: {missing:?}"
        );
        assert!(
            stale.is_empty(),
            "{at}: names in the map with no file: {stale:?}"
        );
        let mut once = named.clone();
        once.dedup();
        assert_eq!(once, named, "{at}: the map names a file twice");
    }
}

#[test]
fn the_map_reader_skips_headings_and_reads_first_words() {
    let lib = "//! intro\n//! ```text\n//! a/          room\n//! a/b.rs      one\n//!             and more\n//!\n//! c.rs x\n//! ```\n//! after.rs\n";
    assert_eq!(files_the_map_names(lib), ["a/b.rs", "c.rs"]);
}

/// The test files of a tier's directory (`tests/it`, `tests/full`), by name, sub-directories
/// included (`upstream_suite/`).
fn test_files(tier: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join(tier), &mut out);
    out.sort();
    out
}

/// A topic lives in one tier: no test file of the fast tier has the name of one of the full
/// tier's (a topic's tests that need a real server are in a file named for what they add,
/// e.g. `budgets_envoy.rs`, beside the fast tier's `budgets.rs`).
#[test]
fn a_topic_lives_in_one_tier() {
    let names = |tier: &str| -> std::collections::BTreeSet<String> {
        fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(tier))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".rs") && n != "main.rs")
            .collect()
    };
    let (fast, full) = (names("tests/it"), names("tests/full"));
    assert!(fast.len() > 20 && full.len() > 20, "{fast:?} {full:?}");
    let both: Vec<_> = fast.intersection(&full).collect();
    assert!(both.is_empty(), "topics in both tiers: {both:?}");
}

/// Each tier is its own crate root and includes no file of another by path: what both use
/// is the support crate's (`tests/support/`).
#[test]
fn no_test_file_is_included_by_path() {
    let mut found = Vec::new();
    let mut files = 0;
    for tier in ["tests/it", "tests/full", "tests/support"] {
        for path in test_files(tier) {
            files += 1;
            let text = fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("#[path") {
                    found.push(format!("{}:{}", relative(&path), n + 1));
                }
            }
        }
    }
    assert!(files > 100, "the test files were read: {files}");
    assert!(found.is_empty(), "files included by path: {found:#?}");
}
