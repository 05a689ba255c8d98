//! A real browser for the status page's tests: headless Chromium (Debian's
//! package, installed by `scripts/setup-chromium.sh`), run once per look
//! with a fresh profile. A look loads a URL, lets the page's script run and
//! fetch its JSON (a virtual-time budget: the refresh timers run without
//! the test waiting for them), then dumps the DOM or takes a screenshot.
//! The browser dies with the test (a deadline, and `PR_SET_PDEATHSIG`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use crate::workspace;

/// Most time one look may take.
const LOOK_TIMEOUT: Duration = Duration::from_secs(90);

/// Virtual time the page runs before the look (ms): its first load and a
/// refresh or two.
const VIRTUAL_TIME_MS: u32 = 5000;

/// Chromium's path (installed on first use).
pub fn chromium() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let out = std::process::Command::new("bash")
            .arg(workspace().join("scripts/setup-chromium.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/setup-chromium.sh");
        assert!(out.status.success(), "setup-chromium.sh failed");
        let text = String::from_utf8_lossy(&out.stdout);
        PathBuf::from(text.lines().last().expect("chromium's path").trim())
    })
    .clone()
}

/// Runs headless Chromium on `url` with `extra` flags; its stdout.
async fn look(url: &str, extra: &[String]) -> String {
    let profile = tempfile::tempdir().expect("a profile dir");
    let mut cmd = tokio::process::Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .arg(format!("--virtual-time-budget={VIRTUAL_TIME_MS}"))
    .args(extra)
    .arg(url)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe; the browser dies with this process.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let child = cmd.spawn().expect("start chromium");
    let out = tokio::time::timeout(LOOK_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("chromium did not finish {url} within {LOOK_TIMEOUT:?}"))
        .expect("chromium");
    assert!(
        out.status.success(),
        "chromium on {url}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The DOM of `url` once its script ran.
pub async fn dom(url: &str) -> String {
    look(url, &["--dump-dom".to_string()]).await
}

/// A screenshot of `url` (width × height) written to `file`.
pub async fn screenshot(url: &str, file: &Path, (width, height): (u32, u32)) {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).expect("the screenshot's dir");
    }
    let _ = std::fs::remove_file(file);
    look(
        url,
        &[
            format!("--window-size={width},{height}"),
            "--hide-scrollbars".into(),
            format!("--screenshot={}", file.display()),
        ],
    )
    .await;
    let size = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
    assert!(size > 1000, "no screenshot of {url} at {}", file.display());
}

/// Opens `url` in headless Chromium in real time (no virtual clock), as a
/// person leaves a page open: it runs, refreshing itself, until the child
/// is killed or dropped.
pub fn keep_open(url: &str) -> (tokio::process::Child, tempfile::TempDir) {
    let profile = tempfile::tempdir().expect("a profile dir");
    let mut cmd = tokio::process::Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--remote-debugging-port=0",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .arg(url)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe; the browser dies with this process.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    (cmd.spawn().expect("start chromium"), profile)
}

/// The text of the element with id `id` in `dom` (its markup, tags
/// included, up to its closing tag): enough for asserting on what a
/// section shows.
pub fn section<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    let start = dom.find(&format!("id=\"{id}\""))?;
    let rest = &dom[start..];
    let end = rest.find("</section>").unwrap_or(rest.len());
    Some(&rest[..end])
}

/// `dom` without its tags: the text a reader sees (entities left as they
/// are).
pub fn text(dom: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for ch in dom.chars() {
        match ch {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                out.push(' ');
            }
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}
