//! The descriptor set that reflection serves for Envoy's rate-limit services
//! (`proto/envoy_rate_limit_services.binpb`) is exactly the closure of `rls.proto` and
//! `rlqs.proto` in the descriptor set of the `envoy-types` package that `Cargo.lock` pins.
//!
//! The file is committed so that a plain build needs nothing but its own dependencies
//! (`build.rs`); this test is what keeps it true when `envoy-types` moves. After an upgrade,
//! `CELLRATE_BLESS=1 cargo test envoy_descriptors` writes the new file.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use prost::Message;

/// The Envoy files whose services reflection describes; their imports come with them.
const ENVOY_SERVICES: [&str; 2] = [
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/service/rate_limit_quota/v3/rlqs.proto",
];

const COMMITTED: &str = "proto/envoy_rate_limit_services.binpb";

/// `src/generated/types.bin` of the `envoy-types` package this build uses. The test
/// binary's own build downloaded every package of the host's graph, so `cargo metadata`
/// can answer offline.
fn envoy_types_descriptor_set() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let host = String::from_utf8(
        std::process::Command::new("rustc")
            .args(["--print", "host-tuple"])
            .output()
            .expect("rustc runs")
            .stdout,
    )
    .unwrap();
    let output = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--locked"])
        .args(["--filter-platform", host.trim()])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let package = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "envoy-types")
        .expect("envoy-types is a dependency");
    let manifest = Path::new(package["manifest_path"].as_str().unwrap());
    manifest.parent().unwrap().join("src/generated/types.bin")
}

/// Splits an encoded `FileDescriptorSet` into its files' encodings (field 1, repeated),
/// without decoding them, so that custom options (validation rules) survive.
fn files(set: &[u8]) -> Vec<&[u8]> {
    let mut found = Vec::new();
    let mut rest = set;
    while !rest.is_empty() {
        let key = prost::encoding::decode_varint(&mut rest).unwrap();
        assert_eq!(key, (1 << 3) | 2, "a descriptor set holds only field 1");
        let length = prost::encoding::decode_varint(&mut rest).unwrap() as usize;
        found.push(&rest[..length]);
        rest = &rest[length..];
    }
    found
}

/// The encoded set of `roots` and every file they import, directly or not, by name.
fn closure(set: &[u8], roots: &[&str]) -> Vec<u8> {
    let mut by_name = HashMap::new();
    for raw in files(set) {
        let file = prost_types::FileDescriptorProto::decode(raw).unwrap();
        by_name.insert(file.name().to_string(), (raw, file.dependency));
    }
    let mut wanted: Vec<String> = roots.iter().map(|r| r.to_string()).collect();
    let mut seen = BTreeSet::new();
    while let Some(name) = wanted.pop() {
        if seen.insert(name.clone()) {
            let (_, dependencies) = by_name
                .get(&name)
                .unwrap_or_else(|| panic!("{name} is not in envoy-types' descriptor set"));
            wanted.extend(dependencies.iter().cloned());
        }
    }
    let mut out = Vec::new();
    for name in &seen {
        let (raw, _) = &by_name[name];
        prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut out);
        prost::encoding::encode_varint(raw.len() as u64, &mut out);
        out.extend_from_slice(raw);
    }
    out
}

#[test]
fn the_committed_envoy_descriptors_are_envoy_types_own() {
    let all = std::fs::read(envoy_types_descriptor_set()).unwrap();
    let expected = closure(&all, &ENVOY_SERVICES);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(COMMITTED);
    if std::env::var_os("CELLRATE_BLESS").is_some() {
        std::fs::write(&path, &expected).unwrap();
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == expected,
        "{COMMITTED} ({} bytes) differs from the closure of {ENVOY_SERVICES:?} in \
         envoy-types' descriptor set ({} bytes): run `CELLRATE_BLESS=1 cargo test \
         envoy_descriptors` and commit the file",
        committed.len(),
        expected.len()
    );
    // What is served is what is committed.
    assert_eq!(cellrate::proto::ENVOY_RLS_DESCRIPTOR_SET, &committed[..]);
    // Every file of the set decodes, and both services are in it.
    let names: Vec<String> = files(&committed)
        .into_iter()
        .map(|raw| {
            prost_types::FileDescriptorProto::decode(raw)
                .unwrap()
                .name()
                .to_string()
        })
        .collect();
    for service in ENVOY_SERVICES {
        assert!(names.iter().any(|n| n == service), "{service} in {names:?}");
    }
}
