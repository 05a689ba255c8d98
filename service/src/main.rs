//! The `coordstore` binary.

fn main() {
    eprintln!(
        "coordstore: the serve, relay and ctl commands arrive with the coordination-service issue"
    );
    std::process::exit(2);
}
