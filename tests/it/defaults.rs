//! Each `serve` default is written once: the flags and `Settings::default()` (what the
//! in-process tests serve with) give the same settings.

use cellrate::cli::{Cli, Command};
use cellrate::limits::config::LimitTable;
use clap::{CommandFactory, Parser};

use crate::common::harness_settings;

/// `cellrate serve` with no flags (and no `CELLRATE_*` variable) runs with the settings the
/// harness serves with, but for what the harness must set itself, each listed here: the
/// limits directory is not watched or re-read (a test gives its limits as a table, and
/// reloads only when it asks to). The listeners' addresses are not settings: the harness
/// binds its own on loopback port 0.
#[test]
fn the_harness_runs_with_what_serve_runs_with_by_default() {
    // The variables `serve` reads (not every CELLRATE_*: the test command's own switches,
    // such as CELLRATE_SKIP_FRESH_MACHINE, change no flag).
    let command = Cli::command();
    let serve = command
        .find_subcommand("serve")
        .expect("a serve subcommand");
    for arg in serve.get_arguments() {
        if let Some(name) = arg.get_env() {
            assert!(
                std::env::var_os(name).is_none(),
                "{name:?} is set: it would change the flags' defaults"
            );
        }
    }
    let cli = Cli::try_parse_from(["cellrate", "serve"]).unwrap();
    let Command::Serve(args) = cli.command else {
        panic!("`cellrate serve` parses as serve");
    };
    let limits = LimitTable::load_dir(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config"
    )))
    .unwrap();
    let mut served = args.settings(args.tls().unwrap(), args.store(&limits).unwrap());
    // Set by the harness, not by a default.
    let reload = served
        .reload
        .take()
        .expect("serve watches its limits directory");
    assert_eq!(reload.dir, std::path::Path::new("config/"));
    assert!(reload.watch && reload.sighup);
    // Every field, nested ones too, through their Debug forms: a field added later is
    // compared without this test changing.
    let (serve, harness) = (format!("{served:#?}"), format!("{:#?}", harness_settings()));
    let differ: Vec<String> = serve
        .lines()
        .zip(harness.lines())
        .filter(|(a, b)| a != b)
        .map(|(a, b)| format!("serve {} / harness {}", a.trim(), b.trim()))
        .collect();
    assert!(differ.is_empty(), "defaults that differ: {differ:#?}");
    assert_eq!(serve.lines().count(), harness.lines().count());
}
