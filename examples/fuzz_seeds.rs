//! Writes the fuzzers' seed corpus, `fuzz/seeds/<target>/<n>`, from `cellrate::fuzzing::seeds`
//! (built from config/ and the README's requests). Run from the repository root:
//! `cargo run --features fuzzing --example fuzz_seeds`. The test suite checks the committed
//! files match.

#[cfg(feature = "fuzzing")]
fn main() -> std::io::Result<()> {
    use cellrate::fuzzing::{seeds, TARGETS};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join("seeds");
    for (target, _) in TARGETS {
        let dir = root.join(target);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        let seeds = seeds(target);
        for (n, seed) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{n:02}")), seed)?;
        }
        println!("{}: {} seeds", dir.display(), seeds.len());
    }
    Ok(())
}

#[cfg(not(feature = "fuzzing"))]
fn main() {
    eprintln!("the fuzz harnesses are behind a feature: cargo run --features fuzzing --example fuzz_seeds");
    std::process::exit(2);
}
