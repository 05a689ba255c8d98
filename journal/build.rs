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
        "proto/torch.proto",
        "proto/rendezvous.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    // The descriptors are built in too: `known` walks an entry against them
    // to name a field this build does not know.
    let descriptors =
        std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("journal_descriptors.bin");
    prost_build::Config::new()
        .btree_map(["."])
        .bytes(["."])
        .enable_type_names()
        // A namespace's create carries its whole state when imported (about
        // 1 KiB inline): boxed, so that every other `Update` is not that big.
        .boxed(".coordstore.journal.Update.command.create_namespace")
        .file_descriptor_set_path(descriptors)
        .compile_protos(&files, &["proto"])?;
    Ok(())
}
