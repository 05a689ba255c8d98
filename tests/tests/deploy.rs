//! The deployment files in `deploy/`: the systemd units pass
//! `systemd-analyze verify` (with ExecStart pointed at this build's binary,
//! which `verify` requires to exist) and name only flags the binary takes;
//! the shared config file starts a node.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use coordstore_tests::{coordstore_bin, Cluster};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

#[test]
fn the_systemd_units_verify_and_use_real_flags() {
    let dir = tempfile::tempdir().unwrap();
    let bin = coordstore_bin();
    let mut units = Vec::new();
    for i in 1..=3 {
        let text =
            std::fs::read_to_string(deploy().join(format!("systemd/coordstore-{i}.service")))
                .expect("unit file");
        assert!(text.contains(&format!("--node-id {i} ")), "unit {i}");
        // Every flag of ExecStart is one `coordstore serve` takes.
        let help = Command::new(&bin)
            .args(["serve", "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        for flag in text.split_whitespace().filter(|w| w.starts_with("--")) {
            assert!(help.contains(flag), "unit {i}: {flag} is no serve flag");
        }
        let path = dir.path().join(format!("coordstore-{i}.service"));
        std::fs::write(
            &path,
            text.replace("/usr/local/bin/coordstore", bin.to_str().unwrap()),
        )
        .unwrap();
        units.push(path);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .output()
        .expect("systemd-analyze (systemd) is on the machine");
    // verify exits 0 even for a directive it ignores: any output is a defect.
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_config_file_starts_a_node() {
    let config = deploy().join("systemd/coordstore.toml");
    let cluster = Cluster::start(1, &["--config", config.to_str().unwrap()]);
    cluster.wait_leader(&[0], Duration::from_secs(30)).await;
}
