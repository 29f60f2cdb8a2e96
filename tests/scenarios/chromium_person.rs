//! One real person beside a scenario's cohorts: Debian's headless Chromium
//! reading a person's pages through the flood, solving whatever challenge
//! weir shows it with the page's own script, each page timed from the
//! click (`Page.navigate`) to the app's page on screen. The lab's cohorts
//! are models of a browser; this is the browser (issue 55: "a person in a
//! real browser is the final judge").
//!
//! Does not: judge the times (a timing assert on two noisy cores would be
//! flaky); the test asserts every page it asked for was shown, and prints
//! the times for docs/lab.md.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir_lab::runner::{Beside, Running};

use crate::chromium::Chromium;

/// What a person reads: articles, and now and then a search (an expensive
/// page the crawlers are after).
const PAGES: [&str; 12] = [
    "/wiki/Main_Page",
    "/wiki/Seoul",
    "/wiki/Han_River",
    "/w/index.php?search=bridges",
    "/wiki/Mapo_Bridge",
    "/wiki/Banpo_Bridge",
    "/wiki/Jamsil",
    "/w/index.php?search=ferry",
    "/wiki/Yeouido",
    "/wiki/Hangang_Park",
    "/wiki/Bukhansan",
    "/w/index.php?search=trails",
];

/// A person's pause between two pages (reading quickly).
const THINK: Duration = Duration::from_millis(300);

/// No new page is asked for in the run's last seconds: the gateway stops
/// when the load does, and a page cut by that is the lab's end, not weir's.
const LAST_ASK: Duration = Duration::from_secs(4);

/// One page the person asked for: `took` from the click to the app's page
/// on screen, `None` if it never showed; `challenged` if weir's challenge
/// page showed on the way; `seen` what was on screen last.
#[derive(Debug, Clone)]
pub struct PageRead {
    pub variant: String,
    pub path: &'static str,
    pub took: Option<Duration>,
    pub challenged: bool,
    pub seen: String,
}

/// The pages read in every variant's run, in order.
pub type Reads = Arc<Mutex<Vec<PageRead>>>;

/// A [`Beside`] that starts the browser as each variant's load starts and
/// reads [`PAGES`] from fraction `from` of the run on, into `reads`.
pub fn person(from: f64, reads: Reads) -> Beside {
    Beside(Arc::new(move |running: Running| {
        let reads = reads.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the person's runtime");
            rt.block_on(read(running, from, reads));
        });
    }))
}

async fn read(running: Running, from: f64, reads: Reads) {
    let browser = Chromium::with_devtools("about:blank", "1000,800");
    let mut tab = browser.devtools().await;
    let begin = running.start + running.duration.mul_f64(from);
    let last_ask = (running.start + running.duration).checked_sub(LAST_ASK);
    tokio::time::sleep(begin.saturating_duration_since(Instant::now())).await;
    for path in PAGES {
        if last_ask.is_some_and(|t| Instant::now() >= t) {
            break;
        }
        let url = format!("http://{}{path}", running.target);
        let clicked = Instant::now();
        tab.call("Page.navigate", serde_json::json!({ "url": url }))
            .await;
        let shown = until_shown(&mut tab, path).await;
        reads.lock().unwrap().push(PageRead {
            variant: running.variant.clone(),
            path,
            took: shown.shown.then(|| clicked.elapsed()),
            challenged: shown.challenged,
            seen: shown.seen,
        });
        tokio::time::sleep(THINK).await;
    }
}

/// What the tab showed for one page.
struct Shown {
    shown: bool,
    challenged: bool,
    seen: String,
}

/// Polls the tab until the app's page for `path` is on screen (the sim
/// app's pages say `class=NAME` in their first paragraph; a challenge
/// returns to the same path), up to a person's patience.
async fn until_shown(tab: &mut crate::chromium::DevTools, path: &str) -> Shown {
    const PATIENCE: Duration = Duration::from_secs(10);
    let asked = Instant::now();
    let probe = "(() => { const p = document.querySelector('p'); \
                 const weir = document.documentElement.innerHTML.includes('/.weir/challenge'); \
                 return location.pathname + location.search + ' | ' + weir + ' | ' + \
                 (p ? p.textContent : ''); })()";
    let mut shown = Shown {
        shown: false,
        challenged: false,
        seen: String::new(),
    };
    while asked.elapsed() < PATIENCE {
        shown.seen = tab
            .eval(probe)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mut parts = shown.seen.split(" | ");
        let (at, weir, first) = (parts.next(), parts.next(), parts.next());
        shown.challenged |= weir == Some("true");
        if at == Some(path) && first.is_some_and(|p| p.starts_with("class=")) {
            shown.shown = true;
            return shown;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    shown
}

/// The person's pages as a table for the test's output.
pub fn table(reads: &[PageRead]) -> String {
    let mut out = String::from("a real Chromium person (page: ms from click to page)\n");
    for r in reads {
        let took = r.took.map_or_else(
            || format!("never shown ({})", r.seen),
            |t| t.as_millis().to_string(),
        );
        let challenged = if r.challenged { " (challenged)" } else { "" };
        out.push_str(&format!(
            "  {:<12} {:<30} {took}{challenged}\n",
            r.variant, r.path
        ));
    }
    out
}
