//! The fuzz harnesses (`cellrate::fuzzing`) in the normal test suite, bounded: the seeds
//! built from the examples, the committed corpus and crash reproducers under `fuzz/`, and a
//! few hundred random and mutated inputs per target. Long runs are `cargo fuzz`
//! (RELIABILITY.md); what they find is committed to `fuzz/regressions/<target>/`.

use std::path::Path;

use cellrate::fuzzing::{seeds, TARGETS};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

fn harness(target: &str) -> fn(&[u8]) {
    TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, run)| *run)
        .unwrap_or_else(|| panic!("no harness {target}"))
}

/// The files of `fuzz/<kind>/<target>/`, by name.
fn committed(kind: &str, target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join(kind)
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<(String, Vec<u8>)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().is_file())
        .map(|e| {
            let bytes = std::fs::read(e.path()).expect("readable corpus file");
            (e.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn every_target_has_seeds_and_they_hold() {
    for (target, run) in TARGETS {
        let seeds = seeds(target);
        assert!(seeds.len() >= 4, "{target}: {} seeds", seeds.len());
        for seed in &seeds {
            run(seed);
        }
    }
}

#[test]
fn committed_seed_corpus_is_the_generated_one() {
    // `cargo run --features fuzzing --example fuzz_seeds` writes fuzz/seeds/; a seed change not written out
    // would leave the fuzzers starting from stale inputs.
    for (target, _) in TARGETS {
        let mut on_disk: Vec<Vec<u8>> = committed("seeds", target)
            .into_iter()
            .map(|(_, bytes)| bytes)
            .collect();
        let mut built = seeds(target);
        on_disk.sort();
        built.sort();
        assert_eq!(on_disk, built, "fuzz/seeds/{target} is out of date");
    }
}

#[test]
fn committed_reproducers_hold() {
    // Inputs that once broke a harness property, kept so that they stay fixed (RELIABILITY.md
    // says what each was).
    let mut count = 0;
    for (target, run) in TARGETS {
        for (name, bytes) in committed("regressions", target) {
            eprintln!("{target}/{name}");
            run(&bytes);
            count += 1;
        }
    }
    assert!(count >= 1, "no reproducers found under fuzz/regressions/");
}

/// A seed of `target` with a few bytes overwritten, inserted or cut.
fn mutated(target: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let seeds = seeds(target);
    let count = seeds.len();
    (
        0..count,
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
    )
        .prop_map(move |(pick, edits)| {
            let mut bytes = seeds[pick].clone();
            for (at, byte, how) in edits {
                let len = bytes.len();
                match how {
                    0 if len > 0 => {
                        let i = at.index(len);
                        bytes[i] = byte;
                    }
                    1 => bytes.insert(at.index(len + 1), byte),
                    _ if len > 0 => {
                        let i = at.index(len);
                        bytes.truncate(i);
                    }
                    _ => bytes.push(byte),
                }
            }
            bytes
        })
}

/// Runs `target`'s harness over 256 inputs: random bytes up to `max_len`, or a mutated
/// seed. proptest shrinks and reports a failing input.
fn holds_for_random_and_mutated_inputs(target: &'static str, max_len: usize) {
    let run = harness(target);
    let inputs = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..max_len),
        mutated(target),
    ];
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    if let Err(e) = runner.run(&inputs, |bytes| {
        run(&bytes);
        Ok(())
    }) {
        panic!("{target}: {e}");
    }
}

#[test]
fn limits_config_holds() {
    holds_for_random_and_mutated_inputs("limits_config", 512);
}

#[test]
fn id_canonicalisation_holds() {
    holds_for_random_and_mutated_inputs("id_canonicalisation", 128);
}

#[test]
fn descriptor_mapping_holds() {
    holds_for_random_and_mutated_inputs("descriptor_mapping", 256);
}

#[test]
fn should_rate_limit_holds() {
    holds_for_random_and_mutated_inputs("should_rate_limit", 256);
}

#[test]
fn check_holds() {
    holds_for_random_and_mutated_inputs("check", 256);
}

#[test]
fn uds_authority_holds() {
    holds_for_random_and_mutated_inputs("uds_authority", 256);
}

#[test]
fn grpc_framing_holds() {
    holds_for_random_and_mutated_inputs("grpc_framing", 256);
}
