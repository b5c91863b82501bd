//! A real browser for the console tests: Debian's headless Chromium driven over WebDriver
//! by its ChromeDriver, both installed by `scripts/ensure-chromium.sh`. Each [`Browser`]
//! runs its own ChromeDriver on a free port with a fresh profile, so tests never share
//! cookies, storage or a session.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

use super::*;

/// Where screenshots go: `target/ui/`.
#[must_use]
pub fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"), PathBuf::from);
    target.join("ui")
}

/// One headless Chromium session. Call [`Browser::close`] at the end of a test; dropping
/// it without closing still stops ChromeDriver (and with it the browser).
pub struct Browser {
    pub client: Client,
    driver: Child,
    profile: PathBuf,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser").field("profile", &self.profile).finish_non_exhaustive()
    }
}

/// The paths of `chromedriver` and `chromium`, installing them when needed; `None` when
/// they cannot be installed here and `TALLY_SKIP_BROWSER=1` says to skip browser tests on
/// purpose (without it, that is a failure: CI installs them; under CI the variable itself
/// is refused).
///
/// # Panics
/// When they cannot be installed and skipping was not asked for.
#[must_use]
pub fn browser_binaries() -> Option<(String, String)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let found = Command::new(root.join("scripts/ensure-chromium.sh")).output().expect("run ensure-chromium.sh");
    if found.status.code() == Some(3) && crate::skip_asked("TALLY_SKIP_BROWSER") {
        eprintln!("browser test skipped on purpose: {}", String::from_utf8_lossy(&found.stderr));
        return None;
    }
    assert!(found.status.success(), "ensure-chromium.sh: {}", String::from_utf8_lossy(&found.stderr));
    let driver = String::from_utf8(found.stdout).expect("a path").trim().to_owned();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let chromium = std::env::split_paths(&path)
        .map(|dir| dir.join("chromium"))
        .find(|p| p.is_file())
        .expect("chromium on PATH next to chromedriver");
    Some((driver, chromium.display().to_string()))
}

impl Browser {
    /// Starts ChromeDriver and a headless Chromium session; `None` when browser tests are
    /// skipped on purpose (see [`browser_binaries`]).
    ///
    /// # Panics
    /// When the browser cannot be started.
    pub async fn start() -> Option<Self> {
        let (driver_path, chromium) = browser_binaries()?;
        let addr = free_addr();
        // Its own process group: stopping it stops the browsers it started too.
        let driver = Command::new(&driver_path)
            .process_group(0)
            .arg(format!("--port={}", addr.trim_start_matches("127.0.0.1:")))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let profile = std::env::temp_dir().join(format!("tally-chromium-{}", uuid::Uuid::new_v4().simple()));
        let mut caps = serde_json::Map::new();
        // Keeps the page's console messages (and the failed loads Chromium reports there)
        // for [`Browser::console_log`].
        caps.insert("goog:loggingPrefs".into(), json!({ "browser": "ALL" }));
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
                    format!("--user-data-dir={}", profile.display()),
                ],
            }),
        );
        let url = format!("http://{addr}");
        let browser = Self { client: connect(&url, caps).await, driver, profile };
        browser.client.set_window_size(1400, 1000).await.expect("size the window");
        Some(browser)
    }

    /// Opens `url`.
    ///
    /// # Panics
    /// When navigation fails.
    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    /// The text of the first element matching `css`, `None` when there is none.
    pub async fn text(&self, css: &str) -> Option<String> {
        let el = self.client.find(Locator::Css(css)).await.ok()?;
        el.text().await.ok()
    }

    /// Waits until the first element matching `css` has a text for which `pred` holds;
    /// returns that text.
    ///
    /// # Panics
    /// When the deadline passes.
    pub async fn wait_text(&self, css: &str, what: &str, pred: impl Fn(&str) -> bool) -> String {
        wait_until(&format!("{css}: {what}"), Deadline::DEFAULT, || async {
            match self.text(css).await {
                Some(t) if pred(&t) => Ok(t),
                other => Err(format!("text is {other:?}")),
            }
        })
        .await
    }

    /// The `value` property of the first element matching `css` (an input's or a
    /// select's current value).
    pub async fn value(&self, css: &str) -> Option<String> {
        let el = self.client.find(Locator::Css(css)).await.ok()?;
        el.prop("value").await.ok().flatten()
    }

    /// Whether the first element matching `css` is enabled (`None`: no such element).
    pub async fn enabled(&self, css: &str) -> Option<bool> {
        let el = self.client.find(Locator::Css(css)).await.ok()?;
        el.is_enabled().await.ok()
    }

    /// Waits until `css` exists and is enabled, then clicks it. The console re-renders
    /// its panels as it polls, so a click that finds a replaced element is retried.
    ///
    /// # Panics
    /// When it never becomes clickable.
    pub async fn click(&self, css: &str) {
        wait_until(&format!("a click on {css}"), Deadline::DEFAULT, || async {
            let el = self.client.find(Locator::Css(css)).await.map_err(|e| e.to_string())?;
            if !el.is_enabled().await.map_err(|e| e.to_string())? {
                return Err("disabled".to_owned());
            }
            el.click().await.map_err(|e| e.to_string())
        })
        .await;
    }

    /// Types `text` into the input `css` after clearing it.
    ///
    /// # Panics
    /// When there is no such input.
    pub async fn type_into(&self, css: &str, text: &str) {
        let el = self.client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("find {css}: {e}"));
        el.clear().await.unwrap_or_else(|e| panic!("clear {css}: {e}"));
        el.send_keys(text).await.unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    /// The browser's console messages since the last call (ChromeDriver's `browser` log):
    /// `(level, message)`, including every resource that failed to load, e.g.
    /// `Failed to load resource: the server responded with a status of 404`.
    ///
    /// # Panics
    /// When ChromeDriver does not hand the log over.
    pub async fn console_log(&self) -> Vec<(String, String)> {
        let log = self.client.issue_cmd(BrowserLog).await.unwrap_or_else(|e| panic!("read the browser log: {e}"));
        log.as_array()
            .map(|entries| {
                entries
                    .iter()
                    .map(|e| {
                        let field = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
                        (field("level"), field("message"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Evaluates `script` (a function body; `return` gives the result) in the page.
    ///
    /// # Panics
    /// When the script throws.
    pub async fn eval(&self, script: &str) -> serde_json::Value {
        self.client.execute(script, vec![]).await.unwrap_or_else(|e| panic!("run script: {e}"))
    }

    /// Sets the window's outer size.
    ///
    /// # Panics
    /// When the window cannot be resized.
    pub async fn resize(&self, width: u32, height: u32) {
        self.client.set_window_size(width, height).await.unwrap_or_else(|e| panic!("resize to {width}x{height}: {e}"));
    }

    /// Saves a PNG of the page as `target/ui/<name>.png`; returns its path.
    ///
    /// # Panics
    /// When the screenshot cannot be taken or written.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.unwrap_or_else(|e| panic!("screenshot {name}: {e}"));
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).expect("create target/ui");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write a screenshot");
        path
    }

    /// Ends the WebDriver session (closing the browser) and stops ChromeDriver.
    pub async fn close(mut self) {
        let client = self.client.clone();
        let _ = client.close().await;
        self.stop_driver();
    }

    fn stop_driver(&mut self) {
        // The whole group: ChromeDriver and any Chromium left behind by a failed test.
        // `--` before the negative id: without it `kill` may read it as an option, and a
        // bare `-1` would mean every process.
        let group = self.driver.id();
        if group > 1 {
            let _ = Command::new("kill").args(["-s", "KILL", "--", &format!("-{group}")]).status();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.stop_driver();
    }
}

/// ChromeDriver's own command for a log (`POST /session/{id}/se/log`): W3C WebDriver has
/// none.
#[derive(Debug)]
struct BrowserLog;

impl fantoccini::wd::WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(&self, base_url: &url::Url, session_id: Option<&str>) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!("session/{}/se/log", session_id.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(json!({ "type": "browser" }).to_string()))
    }
}

/// Connects to the ChromeDriver at `url` once it listens.
async fn connect(url: &str, caps: serde_json::Map<String, serde_json::Value>) -> Client {
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    wait_until("ChromeDriver starts a Chromium session", Deadline::DEFAULT, || {
        let caps = caps.clone();
        let connector = connector.clone();
        async move { ClientBuilder::new(connector).capabilities(caps).connect(url).await.map_err(|e| e.to_string()) }
    })
    .await
}
