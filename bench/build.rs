//! Generates the client stubs of the etcd v3 API subset the etcd peer uses
//! (`proto/etcd.proto`). protoc comes from the `protoc-bin-vendored` crate.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    println!("cargo:rerun-if-changed=proto/etcd.proto");
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_protos(&["proto/etcd.proto"], &["proto"])?;
    Ok(())
}
