//! Generates the wire types and tonic stubs from `proto/*.proto`.
//! protoc comes from the `protoc-bin-vendored` crate, so nothing needs to be
//! installed on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    let files = [
        "proto/xla_coordination.proto",
        "proto/grpc_payloads.proto",
        "proto/tf_coordination.proto",
        "proto/coordstore.proto",
        "proto/tf_data.proto",
        "proto/tf_graph.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .bytes(".xla.coordination.KeyValueEntry.value")
        .bytes(".tensorflow.KeyValueEntry.value")
        .bytes(".coordstore.v1")
        .bytes(".tensorflow.data")
        .compile_protos(&files, &["proto"])?;
    Ok(())
}
