//! Compiles `proto/` without a system `protoc`: `protox` parses the files in Rust and
//! hands the descriptors to tonic's generator. The encoded descriptor set is also written
//! out for server reflection, together with the descriptors of Envoy's rate-limit services
//! (taken from the `envoy-types` crate, which ships Envoy's whole descriptor set), so that
//! grpcurl can describe and call `ShouldRateLimit` and `StreamRateLimitQuotas` without
//! Envoy's protos.

use std::path::{Path, PathBuf};

use prost::Message;

/// The Envoy files whose services reflection describes; their imports come with them.
const ENVOY_SERVICES: [&str; 2] = [
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/service/rate_limit_quota/v3/rlqs.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/cellrate/v1/cellrate.proto",
        "proto/cellrate/v1/admin.proto",
    ];
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_imports(true).include_source_info(true);
    compiler.open_files(protos)?;
    let fds = compiler.file_descriptor_set();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("cellrate_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure().compile_fds(fds)?;
    println!("cargo:rerun-if-changed=proto");

    let envoy_set = envoy_types_descriptor_set()?;
    println!("cargo:rerun-if-changed={}", envoy_set.display());
    let all = std::fs::read(&envoy_set)?;
    let subset = closure(&all, &ENVOY_SERVICES)?;
    std::fs::write(out_dir.join("envoy_rls_descriptor.bin"), subset)?;
    Ok(())
}

/// `src/generated/types.bin` of the `envoy-types` package this build uses, found with
/// `cargo metadata` (which knows where the registry, a vendor directory or a path puts it).
fn envoy_types_descriptor_set() -> Result<PathBuf, Box<dyn std::error::Error>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR")?;
    // Offline, and only the packages of the target platform: those are already downloaded
    // for this build (the whole graph, other platforms' crates included, may not be).
    let target = std::env::var("TARGET")?;
    let output = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", &target])
        .current_dir(&manifest_dir)
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let package = metadata["packages"]
        .as_array()
        .and_then(|packages| packages.iter().find(|p| p["name"] == "envoy-types"))
        .ok_or("cargo metadata lists no envoy-types package")?;
    let manifest = package["manifest_path"]
        .as_str()
        .ok_or("envoy-types has no manifest_path")?;
    let path = Path::new(manifest)
        .parent()
        .ok_or("envoy-types' manifest has no directory")?
        .join("src/generated/types.bin");
    if !path.is_file() {
        return Err(format!("{} is missing", path.display()).into());
    }
    Ok(path)
}

/// Splits an encoded `FileDescriptorSet` into its files' encodings (field 1, repeated),
/// without decoding them, so that custom options (validation rules) survive.
fn files(set: &[u8]) -> Result<Vec<&[u8]>, Box<dyn std::error::Error>> {
    fn varint(bytes: &[u8], at: &mut usize) -> Result<u64, Box<dyn std::error::Error>> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *bytes.get(*at).ok_or("truncated descriptor set")?;
            *at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("varint too long in descriptor set".into())
    }
    let mut found = Vec::new();
    let mut at = 0;
    while at < set.len() {
        if varint(set, &mut at)? != (1 << 3) | 2 {
            return Err("a descriptor set holds only field 1, length-delimited".into());
        }
        let length = usize::try_from(varint(set, &mut at)?)?;
        let end = at.checked_add(length).ok_or("length overflow")?;
        found.push(set.get(at..end).ok_or("truncated file in descriptor set")?);
        at = end;
    }
    Ok(found)
}

/// The encoded set of `roots` and every file they import, directly or not.
fn closure(set: &[u8], roots: &[&str]) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let mut by_name = std::collections::HashMap::new();
    for raw in files(set)? {
        let file = prost_types::FileDescriptorProto::decode(raw)?;
        by_name.insert(file.name().to_string(), (raw, file.dependency));
    }
    let mut wanted: Vec<String> = roots.iter().map(|r| r.to_string()).collect();
    let mut seen = std::collections::BTreeSet::new();
    while let Some(name) = wanted.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let (_, dependencies) = by_name
            .get(&name)
            .ok_or_else(|| format!("{name} is not in envoy-types' descriptor set"))?;
        wanted.extend(dependencies.iter().cloned());
    }
    let mut out = Vec::new();
    for name in &seen {
        let (raw, _) = &by_name[name];
        prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut out);
        prost::encoding::encode_varint(raw.len() as u64, &mut out);
        out.extend_from_slice(raw);
    }
    Ok(out)
}
