//! Compiles `proto/` without a system `protoc`: `protox` parses the files in Rust and
//! hands the descriptors to tonic's generator. The encoded descriptor set is also written
//! out for server reflection.
//!
//! Envoy's rate-limit services are described by reflection from a descriptor set committed
//! in `proto/` (see `proto/README.md`), not looked up here: a build script that asks cargo
//! where another package lives resolves the whole graph, dev-dependencies included, which
//! a plain build never downloads.

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `proto/` stays at the repository's root, where operators point grpcurl.
    let protos = [
        "../../proto/cellrate/v1/cellrate.proto",
        "../../proto/cellrate/v1/admin.proto",
    ];
    let mut compiler = protox::Compiler::new(["../../proto"])?;
    compiler.include_imports(true).include_source_info(true);
    compiler.open_files(protos)?;
    let fds = compiler.file_descriptor_set();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("cellrate_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure().compile_fds(fds)?;
    println!("cargo:rerun-if-changed=../../proto");
    Ok(())
}
