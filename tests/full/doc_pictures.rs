//! The docs' pictures drawn from `cellrate simulate` by Python scripts are current (the
//! calendar windows they show are the fast tier's `tests/it/calendar.rs`).
use std::path::Path;

/// `docs/budgets.md`'s picture of GCRA against a calendar window is drawn from `cellrate
/// simulate` by `scripts/budget-picture.py`. The same traffic: the calendar window admits
/// its ten at the top of each hour.
#[test]
fn the_budget_picture_is_drawn_from_simulate() {
    redrawn(
        "scripts/budget-picture.py",
        "docs/img/gcra-vs-calendar.svg",
        &[
            ("40 of 91 requests allowed", "GCRA's count"),
            ("37 of 91 requests allowed", "the calendar's count"),
        ],
    );
}

/// #51: `docs/configuration.md`'s picture of a month in two time zones, drawn by
/// `scripts/zone-picture.py`. Tokyo's December starts 14 hours before New York's, so the
/// same traffic gets ten requests back 14 hours earlier there: both spend their ten by 27 h
/// in; Tokyo's month turns at 39 h (requests at 39 to 66 h allowed), New York's at 53 h.
#[test]
fn the_zone_picture_is_drawn_from_simulate() {
    redrawn(
        "scripts/zone-picture.py",
        "docs/img/month-in-two-zones.svg",
        &[
            ("20 of 25 requests allowed", "Tokyo's count"),
            ("17 of 25 requests allowed", "New York's count"),
        ],
    );
}

/// Draws a picture with `script` from `cellrate simulate`, checks it says each of `says`,
/// and that it is the committed `svg`, so that a picture changes when the arithmetic does.
fn redrawn(script: &str, svg: &str, says: &[(&str, &str)]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = std::env::var("CELLRATE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = tempfile::tempdir().unwrap();
    let drawn = out.path().join("picture.svg");
    let status = std::process::Command::new(python)
        .arg(root.join(script))
        .arg(env!("CARGO_BIN_EXE_cellrate"))
        .arg(&drawn)
        .status()
        .expect("python3 runs");
    assert!(status.success(), "{script} failed: {status}");
    let drawn = std::fs::read_to_string(drawn).unwrap();
    for (text, what) in says {
        assert!(drawn.contains(text), "{what}: {text:?}");
    }
    let committed = std::fs::read_to_string(root.join(svg)).unwrap();
    assert!(
        drawn == committed,
        "{svg} is out of date: run {script} target/debug/cellrate {svg}"
    );
}
