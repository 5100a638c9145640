//! Helpers of the sweeper's tests that both tiers use (`tests/it/release_sweep.rs`,
//! `tests/full/release_sweep_redis.rs`): limits of which a reload removes one, and a log
//! captured from the tasks of an in-process server.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// `Released` (as `reservations::limits`'s) and `Gone`, a budget of the same shape that
/// [`remove_gone`] takes out.
pub fn limits() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), true);
    dir
}

/// Rewrites the limits without `Gone` (a reload then drops it).
pub fn remove_gone(dir: &Path) {
    write(dir, false);
}

fn write(dir: &Path, gone: bool) {
    let block = "reservation: {hold: 10m, unsettled: release}";
    let (mut names, mut defaults) = (
        "Released: {number: 100, format: string}\n".to_string(),
        format!("Released: {{burst: 10000, count: 1, period: 8h, {block}}}\n"),
    );
    if gone {
        names.push_str("Gone: {number: 103, format: string}\n");
        defaults.push_str(&format!(
            "Gone: {{burst: 10000, count: 1, period: 8h, {block}}}\n"
        ));
    }
    std::fs::write(dir.join("names.yaml"), names).unwrap();
    std::fs::write(dir.join("defaults.yaml"), defaults).unwrap();
}

/// The WARN (and worse) lines logged on this thread while the guard lives: a
/// current-thread runtime's tasks (an in-process server's sweeper) log on it.
pub struct Captured {
    lines: Arc<Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

#[derive(Clone)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    pub fn warnings() -> Captured {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink(lines.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish();
        Captured {
            lines,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    /// The lines that mention `part`.
    pub fn lines_with(&self, part: &str) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.lines.lock().unwrap()).to_string();
        text.lines()
            .filter(|l| l.contains(part))
            .map(str::to_string)
            .collect()
    }
}
