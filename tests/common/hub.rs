//! A tiny Hub-like HTTP server on 127.0.0.1 for the tests of Hub models and datasets: the revision API answers
//! the commit and its file list, `resolve` serves files with the headers `hf-hub` reads (`x-repo-commit`, `etag`,
//! `content-range` for range requests). It requires the bearer token when one is given, logs each request as
//! "GET path authorization" before answering (so a client that got its answer finds its request in the log), and
//! stops when dropped, after 60 s, or after 500 requests, whichever comes first.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Files (name, bytes) of each commit, by commit sha.
pub type Commits = HashMap<&'static str, Vec<(&'static str, Vec<u8>)>>;

/// What the server serves.
pub struct Repo {
    /// `owner/name`.
    pub id: &'static str,
    /// A dataset repository (`/api/datasets/...`, `/datasets/...`) rather than a model one.
    pub dataset: bool,
    /// Branch or tag names and the commit each points to (a full sha also resolves to itself).
    pub revisions: &'static [(&'static str, &'static str)],
    /// The files of each commit.
    pub commits: Commits,
    /// The bearer token every request must carry, if any.
    pub token: Option<&'static str>,
}

/// A running server; `endpoint` is its base URL.
pub struct HubServer {
    pub endpoint: String,
    log: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HubServer {
    pub fn start(repo: Repo) -> HubServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (log2, stop2) = (log.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut served = 0;
            while !stop2.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(60) && served < 500 {
                match listener.accept() {
                    Ok((stream, _)) => {
                        served += 1;
                        handle(stream, &repo, &log2);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        HubServer {
            endpoint,
            log,
            stop,
            thread: Some(thread),
        }
    }

    /// The requests so far, as "GET path authorization".
    pub fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for HubServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Logs one request, then answers it and closes the connection.
fn handle(stream: TcpStream, repo: &Repo, log: &Mutex<Vec<String>>) -> Option<()> {
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut request = String::new();
    reader.read_line(&mut request).ok()?;
    let mut headers = HashMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let path = request.split_whitespace().nth(1)?.to_string();
    let auth = headers.get("authorization").cloned().unwrap_or_default();
    log.lock().unwrap().push(format!("GET {path} {auth}"));
    let commits = &repo.commits;
    let resolve = |rev: &str| {
        repo.revisions
            .iter()
            .find(|(name, _)| *name == rev)
            .map(|(_, sha)| *sha)
            .or_else(|| commits.keys().find(|k| **k == rev).copied())
    };
    let authorized = repo.token.is_none_or(|t| auth == format!("Bearer {t}"));
    let id = repo.id;
    let (info_prefix, file_prefix) = if repo.dataset {
        (
            format!("/api/datasets/{id}/revision/"),
            format!("/datasets/{id}/resolve/"),
        )
    } else {
        (format!("/api/models/{id}/revision/"), format!("/{id}/resolve/"))
    };
    let (status, extra, body): (u16, Vec<(String, String)>, Vec<u8>) = if !authorized {
        (401, vec![], b"unauthorized".to_vec())
    } else if let Some(sha) = path.strip_prefix(&info_prefix).and_then(resolve) {
        let siblings: Vec<String> = commits[sha]
            .iter()
            .map(|(name, _)| format!(r#"{{"rfilename": "{name}"}}"#))
            .collect();
        let body = format!(
            r#"{{"id": "{id}", "sha": "{sha}", "siblings": [{}]}}"#,
            siblings.join(",")
        );
        (
            200,
            vec![("content-type".into(), "application/json".into())],
            body.into_bytes(),
        )
    } else if let Some((sha, data)) = path
        .strip_prefix(&file_prefix)
        .and_then(|rest| rest.split_once('/'))
        .and_then(|(rev, file)| Some((resolve(rev)?, file)))
        .and_then(|(sha, file)| Some((sha, &commits[sha].iter().find(|(name, _)| *name == file)?.1)))
    {
        let etag = format!("\"{:016x}\"", fnv(data));
        let mut h = vec![("x-repo-commit".into(), sha.to_string()), ("etag".into(), etag)];
        match headers.get("range").and_then(|r| r.strip_prefix("bytes=")) {
            Some(range) => {
                let (a, b) = range.split_once('-')?;
                let a: usize = a.parse().ok()?;
                let b: usize = if b.is_empty() { data.len() - 1 } else { b.parse().ok()? };
                let b = b.min(data.len() - 1);
                h.push(("content-range".into(), format!("bytes {a}-{b}/{}", data.len())));
                (206, h, data[a..=b].to_vec())
            }
            None => (200, h, data.clone()),
        }
    } else {
        (404, vec![], b"not found".to_vec())
    };
    let mut head = format!(
        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = stream;
    out.write_all(head.as_bytes()).ok()?;
    out.write_all(&body).ok()?;
    out.flush().ok()
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}
