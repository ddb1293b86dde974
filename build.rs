//! Compiles the vendored Dapr protos (`proto/dapr/`) into the gRPC server
//! the gateway serves Dapr's API with: protox parses them in Rust, so the
//! build needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["dapr/dapr.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
