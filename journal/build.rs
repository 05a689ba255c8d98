//! Generates the journal's prost types from `proto/*.proto`: the shared
//! messages (`base.proto`, `journal.proto`) and one file per area. Maps are
//! `BTreeMap`s so the encoding of a state is canonical (its digest is stable).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    let files = [
        "proto/base.proto",
        "proto/journal.proto",
        "proto/coordination.proto",
        "proto/dispatcher.proto",
        "proto/closures.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    prost_build::Config::new()
        .btree_map(["."])
        .bytes(["."])
        .compile_protos(&files, &["proto"])?;
    Ok(())
}
