//! A local HTTP server that implements the parts of the GitHub and GitLab REST APIs that
//! `bench::publish` uses, with real state (comments are stored, listed in pages, edited),
//! token checks, a log of every request, and faults the tests queue (rate limits, 5xx).
//! Shared by tests/publish_github.rs and tests/publish_gitlab.rs.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde_json::{json, Value};
use tiny_http::{Header, Response, Server};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    GitHub,
    GitLab,
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// Raw path and query, exactly as sent (percent-encoding kept).
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn path(&self) -> &str {
        self.url.split('?').next().unwrap_or("")
    }
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("request body is JSON")
    }
}

/// A stored comment or note.
#[derive(Debug, Clone)]
pub struct Comment {
    pub id: u64,
    pub body: String,
    /// GitLab system notes ("added 1 commit").
    pub system: bool,
}

/// A queued fault: the next request with this method answers with this status and these
/// headers instead of being served. With `apply`, the request is served first (the write
/// happens) and the answer is replaced, as when a proxy loses the server's answer.
#[derive(Debug, Clone)]
pub struct Fault {
    pub method: &'static str,
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    pub apply: bool,
    /// Put the request's token header into the answer's message (a misbehaving proxy).
    pub echo_auth: bool,
}

impl Fault {
    pub fn new(method: &'static str, status: u16) -> Self {
        Fault {
            method,
            status,
            headers: vec![],
            body: String::new(),
            apply: false,
            echo_auth: false,
        }
    }
    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_string()));
        self
    }
    pub fn body(mut self, body: &str) -> Self {
        self.body = body.to_string();
        self
    }
    pub fn echoing_auth(mut self) -> Self {
        self.echo_auth = true;
        self
    }
    pub fn after_applying(mut self) -> Self {
        self.apply = true;
        self
    }
}

#[derive(Default)]
struct State {
    comments: Vec<Comment>,
    next_id: u64,
    seen: Vec<Seen>,
    faults: VecDeque<Fault>,
    statuses: Vec<(String, Value)>,
}

pub struct FakeApi {
    pub flavor: Flavor,
    pub base: String,
    pub token: String,
    page_size: usize,
    state: Arc<Mutex<State>>,
    server: Arc<Server>,
    thread: Option<JoinHandle<()>>,
}

impl FakeApi {
    /// Starts the server on a free loopback port. `token` is the only one it accepts.
    /// Listings come in pages of `page_size` whatever `per_page` asks, so pagination is
    /// exercised with a handful of comments.
    pub fn start(flavor: Flavor, token: &str, page_size: usize) -> Self {
        let server = Arc::new(Server::http("127.0.0.1:0").expect("bind a loopback port"));
        let port = server.server_addr().to_ip().expect("an IP address").port();
        let root = format!("http://127.0.0.1:{port}");
        let base = match flavor {
            Flavor::GitHub => root.clone(),
            Flavor::GitLab => format!("{root}/api/v4"),
        };
        let state = Arc::new(Mutex::new(State {
            next_id: 1000,
            ..State::default()
        }));
        let thread = {
            let server = Arc::clone(&server);
            let state = Arc::clone(&state);
            let token = token.to_string();
            std::thread::spawn(move || {
                for mut req in server.incoming_requests() {
                    let mut body = String::new();
                    let _ = req.as_reader().read_to_string(&mut body);
                    let seen = Seen {
                        method: req.method().as_str().to_string(),
                        url: req.url().to_string(),
                        headers: req
                            .headers()
                            .iter()
                            .map(|h| (h.field.as_str().to_string(), h.value.as_str().to_string()))
                            .collect(),
                        body,
                    };
                    let (status, headers, text) =
                        handle(flavor, &root, &token, page_size, &state, seen);
                    let mut resp = Response::from_string(text).with_status_code(status);
                    resp.add_header(
                        Header::from_bytes("Content-Type", "application/json").unwrap(),
                    );
                    for (k, v) in headers {
                        resp.add_header(Header::from_bytes(k.as_bytes(), v.as_bytes()).unwrap());
                    }
                    let _ = req.respond(resp);
                }
            })
        };
        FakeApi {
            flavor,
            base,
            token: token.to_string(),
            page_size,
            state,
            server,
            thread: Some(thread),
        }
    }

    pub fn add_comment(&self, body: &str, system: bool) -> u64 {
        let mut s = self.state.lock().unwrap();
        s.next_id += 1;
        let id = s.next_id;
        s.comments.push(Comment {
            id,
            body: body.to_string(),
            system,
        });
        id
    }

    pub fn fault(&self, f: Fault) {
        self.state.lock().unwrap().faults.push_back(f);
    }

    pub fn comments(&self) -> Vec<Comment> {
        self.state.lock().unwrap().comments.clone()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    pub fn clear_seen(&self) {
        self.state.lock().unwrap().seen.clear();
    }

    pub fn statuses(&self) -> Vec<(String, Value)> {
        self.state.lock().unwrap().statuses.clone()
    }

    /// Requests that wrote something (anything but GET).
    pub fn writes(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method != "GET")
            .collect()
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type Answer = (u16, Vec<(String, String)>, String);

fn handle(
    flavor: Flavor,
    root: &str,
    token: &str,
    page_size: usize,
    state: &Mutex<State>,
    seen: Seen,
) -> Answer {
    let mut s = state.lock().unwrap();
    s.seen.push(seen.clone());

    let authorized = match flavor {
        Flavor::GitHub => seen.header("Authorization") == Some(&format!("Bearer {token}")),
        Flavor::GitLab => {
            seen.header("PRIVATE-TOKEN") == Some(token) || seen.header("JOB-TOKEN") == Some(token)
        }
    };
    if !authorized {
        let msg = match flavor {
            Flavor::GitHub => {
                json!({"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest"})
            }
            Flavor::GitLab => json!({"message": "401 Unauthorized"}),
        };
        return (401, vec![], msg.to_string());
    }

    let fault = s
        .faults
        .iter()
        .position(|f| f.method == seen.method)
        .and_then(|i| s.faults.remove(i));
    let answer = match &fault {
        Some(f) if !f.apply => None,
        _ => Some(route(flavor, root, page_size, &mut s, &seen)),
    };
    match fault {
        Some(f) => {
            let headers = f
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect();
            let body = if f.echo_auth {
                let auth = ["Authorization", "PRIVATE-TOKEN", "JOB-TOKEN"]
                    .iter()
                    .find_map(|h| seen.header(h))
                    .unwrap_or("");
                json!({"message": format!("rejected request with credentials {auth}")}).to_string()
            } else {
                f.body
            };
            (f.status, headers, body)
        }
        None => answer.expect("served"),
    }
}

fn page_of(url: &str) -> usize {
    url.split_once('?')
        .map(|(_, q)| q)
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("page="))
        .and_then(|p| p.parse().ok())
        .unwrap_or(1)
}

fn route(flavor: Flavor, root: &str, page_size: usize, s: &mut State, req: &Seen) -> Answer {
    let path = req.path().to_string();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let not_found = (404, vec![], json!({"message": "Not Found"}).to_string());
    let body_of = |req: &Seen| -> Option<String> {
        serde_json::from_str::<Value>(&req.body)
            .ok()?
            .get("body")?
            .as_str()
            .map(str::to_string)
    };
    match flavor {
        Flavor::GitHub => match (req.method.as_str(), parts.as_slice()) {
            // The listing, under its documented path or the `repositories/{id}` form that
            // GitHub's own Link headers use.
            ("GET", ["repos", "o", "r", "issues", "42", "comments"])
            | ("GET", ["repositories", "1", "issues", "42", "comments"]) => {
                let page = page_of(&req.url);
                let items: Vec<Value> = s
                    .comments
                    .iter()
                    .skip((page - 1) * page_size)
                    .take(page_size)
                    .map(|c| json!({"id": c.id, "body": c.body, "html_url": format!("{root}/o/r/pull/42#issuecomment-{}", c.id), "user": {"login": "github-actions[bot]"}}))
                    .collect();
                let mut headers = vec![];
                if page * page_size < s.comments.len() {
                    headers.push((
                        "Link".to_string(),
                        format!(
                            "<{root}/repositories/1/issues/42/comments?per_page=100&page={}>; rel=\"next\", <{root}/repositories/1/issues/42/comments?per_page=100&page=99>; rel=\"last\"",
                            page + 1
                        ),
                    ));
                }
                (200, headers, Value::Array(items).to_string())
            }
            ("POST", ["repos", "o", "r", "issues", "42", "comments"]) => {
                let Some(body) = body_of(req) else {
                    return (
                        422,
                        vec![],
                        json!({"message": "body is missing"}).to_string(),
                    );
                };
                s.next_id += 1;
                let id = s.next_id;
                s.comments.push(Comment {
                    id,
                    body: body.clone(),
                    system: false,
                });
                (201, vec![], json!({"id": id, "body": body, "html_url": format!("{root}/o/r/pull/42#issuecomment-{id}")}).to_string())
            }
            ("PATCH", ["repos", "o", "r", "issues", "comments", id]) => {
                let Some(body) = body_of(req) else {
                    return (
                        422,
                        vec![],
                        json!({"message": "body is missing"}).to_string(),
                    );
                };
                let id: u64 = id.parse().unwrap_or(0);
                match s.comments.iter_mut().find(|c| c.id == id) {
                    Some(c) => {
                        c.body = body.clone();
                        (200, vec![], json!({"id": id, "body": body, "html_url": format!("{root}/o/r/pull/42#issuecomment-{id}")}).to_string())
                    }
                    None => not_found,
                }
            }
            ("POST", ["repos", "o", "r", "statuses", sha]) => {
                let v: Value = serde_json::from_str(&req.body).unwrap_or(Value::Null);
                s.statuses.push((sha.to_string(), v.clone()));
                (201, vec![], v.to_string())
            }
            _ => not_found,
        },
        Flavor::GitLab => match (req.method.as_str(), parts.as_slice()) {
            ("GET", ["api", "v4", "projects", "group%2Fproj", "merge_requests", "7", "notes"]) => {
                let page = page_of(&req.url);
                let items: Vec<Value> = s
                    .comments
                    .iter()
                    .skip((page - 1) * page_size)
                    .take(page_size)
                    .map(|c| json!({"id": c.id, "body": c.body, "system": c.system, "author": {"username": "bench-bot"}}))
                    .collect();
                let next = if page * page_size < s.comments.len() {
                    (page + 1).to_string()
                } else {
                    String::new()
                };
                (
                    200,
                    vec![
                        ("X-Next-Page".to_string(), next),
                        ("X-Page".to_string(), page.to_string()),
                    ],
                    Value::Array(items).to_string(),
                )
            }
            ("POST", ["api", "v4", "projects", "group%2Fproj", "merge_requests", "7", "notes"]) => {
                let Some(body) = body_of(req) else {
                    return (
                        400,
                        vec![],
                        json!({"message": {"body": ["can't be blank"]}}).to_string(),
                    );
                };
                s.next_id += 1;
                let id = s.next_id;
                s.comments.push(Comment {
                    id,
                    body: body.clone(),
                    system: false,
                });
                (
                    201,
                    vec![],
                    json!({"id": id, "body": body, "system": false}).to_string(),
                )
            }
            (
                "PUT",
                ["api", "v4", "projects", "group%2Fproj", "merge_requests", "7", "notes", id],
            ) => {
                let Some(body) = body_of(req) else {
                    return (
                        400,
                        vec![],
                        json!({"message": {"body": ["can't be blank"]}}).to_string(),
                    );
                };
                let id: u64 = id.parse().unwrap_or(0);
                match s.comments.iter_mut().find(|c| c.id == id) {
                    Some(c) => {
                        c.body = body.clone();
                        (
                            200,
                            vec![],
                            json!({"id": id, "body": body, "system": false}).to_string(),
                        )
                    }
                    None => (404, vec![], json!({"message": "404 Not found"}).to_string()),
                }
            }
            _ => (404, vec![], json!({"message": "404 Not found"}).to_string()),
        },
    }
}
