//! Generates the journal's prost types from `proto/journal.proto`. Maps are
//! `BTreeMap`s so the encoding of a state is canonical (its digest is stable).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    println!("cargo:rerun-if-changed=proto/journal.proto");
    prost_build::Config::new()
        .btree_map(["."])
        .bytes(["."])
        .compile_protos(&["proto/journal.proto"], &["proto"])?;
    Ok(())
}
