//! The protocol loop: documents the editor has open, the program each
//! belongs to (the rule files of its directory and below, with open buffers
//! in place of what is on disk), and the answers of [`Analysis`].

use crate::analysis::{Analysis, CompletionKind};
use crate::position::{offset, position};
use crate::ServerError;
use ccattler_parser::{Severity, Sources, Span};
use lsp_server::{Connection, ErrorCode, Message, Notification, Request, Response};
use lsp_types::notification::{self as note, Notification as _};
use lsp_types::request::{self as req, Request as _};
use lsp_types::*;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub fn capabilities() -> ServerCapabilities {
    ServerCapabilities {
        text_document_sync: Some(TextDocumentSyncCapability::Kind(TextDocumentSyncKind::FULL)),
        definition_provider: Some(OneOf::Left(true)),
        references_provider: Some(OneOf::Left(true)),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        completion_provider: Some(CompletionOptions { trigger_characters: Some(vec![":".into(), "(".into()]), ..Default::default() }),
        ..Default::default()
    }
}

/// The server's state between messages.
struct Server {
    /// Open documents' text, by path.
    open: HashMap<PathBuf, String>,
    /// Files diagnostics were published for, per program directory (so a
    /// file whose problems are fixed gets an empty list).
    published: HashMap<PathBuf, BTreeSet<PathBuf>>,
}

pub fn serve(connection: &Connection) -> Result<(), ServerError> {
    let mut server = Server { open: HashMap::new(), published: HashMap::new() };
    for msg in &connection.receiver {
        match msg {
            Message::Request(r) => {
                if connection.handle_shutdown(&r)? {
                    return Ok(());
                }
                let response = server.request(r);
                connection.sender.send(Message::Response(response)).map_err(|_| ServerError::Disconnected)?;
            }
            Message::Notification(n) => {
                for out in server.notification(n) {
                    connection.sender.send(Message::Notification(out)).map_err(|_| ServerError::Disconnected)?;
                }
            }
            Message::Response(_) => {}
        }
    }
    Ok(())
}

impl Server {
    fn request(&mut self, r: Request) -> Response {
        let id = r.id.clone();
        let result = match r.method.as_str() {
            req::GotoDefinition::METHOD => self.params::<GotoDefinitionParams>(&r).and_then(|p| self.definition(p.text_document_position_params)),
            req::References::METHOD => self.params::<ReferenceParams>(&r).and_then(|p| self.references(p)),
            req::HoverRequest::METHOD => self.params::<HoverParams>(&r).and_then(|p| self.hover(p.text_document_position_params)),
            req::Completion::METHOD => self.params::<CompletionParams>(&r).and_then(|p| self.completion(p.text_document_position)),
            other => return Response::new_err(id, ErrorCode::MethodNotFound as i32, format!("`{other}` is not supported")),
        };
        match result {
            Ok(value) => Response::new_ok(id, value),
            Err(message) => Response::new_err(id, ErrorCode::InvalidParams as i32, message),
        }
    }

    fn params<P: serde::de::DeserializeOwned>(&self, r: &Request) -> Result<P, String> {
        serde_json::from_value(r.params.clone()).map_err(|e| format!("bad `{}` params: {e}", r.method))
    }

    fn notification(&mut self, n: Notification) -> Vec<Notification> {
        let path = match n.method.as_str() {
            note::DidOpenTextDocument::METHOD => serde_json::from_value::<DidOpenTextDocumentParams>(n.params).ok().and_then(|p| {
                let path = uri_to_path(&p.text_document.uri)?;
                self.open.insert(path.clone(), p.text_document.text);
                Some(path)
            }),
            note::DidChangeTextDocument::METHOD => serde_json::from_value::<DidChangeTextDocumentParams>(n.params).ok().and_then(|p| {
                let path = uri_to_path(&p.text_document.uri)?;
                // Full sync: the last change holds the whole text.
                let text = p.content_changes.into_iter().last()?.text;
                self.open.insert(path.clone(), text);
                Some(path)
            }),
            note::DidCloseTextDocument::METHOD => serde_json::from_value::<DidCloseTextDocumentParams>(n.params).ok().and_then(|p| {
                let path = uri_to_path(&p.text_document.uri)?;
                self.open.remove(&path);
                Some(path)
            }),
            note::DidSaveTextDocument::METHOD => {
                serde_json::from_value::<DidSaveTextDocumentParams>(n.params).ok().and_then(|p| uri_to_path(&p.text_document.uri))
            }
            _ => None,
        };
        match path {
            Some(path) => self.publish(&path),
            None => vec![],
        }
    }

    /// Checks the program `path` belongs to and gives every file of it its
    /// diagnostics (an empty list clears what an earlier check showed).
    fn publish(&mut self, path: &Path) -> Vec<Notification> {
        let Some(dir) = path.parent().map(Path::to_path_buf) else { return vec![] };
        let (analysis, paths) = self.analyse(&dir);
        let mut by_file: HashMap<usize, Vec<Diagnostic>> = HashMap::new();
        for d in &analysis.checked.diagnostics {
            by_file.entry(d.span.file).or_default().push(to_lsp_diagnostic(&analysis, &paths, d));
        }
        let now: BTreeSet<PathBuf> = paths.iter().cloned().collect();
        let before = self.published.insert(dir, now.clone()).unwrap_or_default();
        let mut out = Vec::new();
        for (id, p) in paths.iter().enumerate() {
            out.push(publish(p, by_file.remove(&id).unwrap_or_default()));
        }
        for gone in before.difference(&now) {
            out.push(publish(gone, vec![]));
        }
        out
    }

    /// The program of directory `dir`: its `.rules` files below it on disk,
    /// open buffers in place of their files (and open files not yet saved).
    fn analyse(&self, dir: &Path) -> (Analysis, Vec<PathBuf>) {
        let mut paths: BTreeSet<PathBuf> = ccattler_parser::rule_files(&[dir.to_path_buf()]).unwrap_or_default().into_iter().collect();
        paths.extend(self.open.keys().filter(|p| p.starts_with(dir) && p.extension().is_some_and(|e| e == "rules")).cloned());
        let mut sources = Sources::new();
        let mut order = Vec::new();
        for p in paths {
            let text = match self.open.get(&p) {
                Some(t) => t.clone(),
                None => match std::fs::read(&p) {
                    Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                    Err(_) => continue,
                },
            };
            // Names as `ccattler check DIR` shows them: below the directory.
            sources.add(p.strip_prefix(dir).unwrap_or(&p).to_string_lossy(), text);
            order.push(p);
        }
        (Analysis::new(sources), order)
    }

    /// The analysis of the program holding the document, and its file id.
    fn at(&self, doc: &TextDocumentPositionParams) -> Result<(Analysis, Vec<PathBuf>, usize, usize), String> {
        let path = uri_to_path(&doc.text_document.uri).ok_or_else(|| format!("{}: not a file: URI", doc.text_document.uri.as_str()))?;
        let dir = path.parent().ok_or_else(|| format!("{}: no directory", path.display()))?;
        let (analysis, paths) = self.analyse(dir);
        let file = paths.iter().position(|p| *p == path).ok_or_else(|| format!("{}: not a .rules file", path.display()))?;
        let at = offset(analysis.sources().text(file), doc.position);
        Ok((analysis, paths, file, at))
    }

    fn definition(&self, p: TextDocumentPositionParams) -> Result<serde_json::Value, String> {
        let (a, paths, file, at) = self.at(&p)?;
        let found: Vec<Location> = a.definition(file, at).into_iter().map(|s| location(&a, &paths, s)).collect();
        Ok(serde_json::to_value(GotoDefinitionResponse::Array(found)).expect("serialisable"))
    }

    fn references(&self, p: ReferenceParams) -> Result<serde_json::Value, String> {
        let (a, paths, file, at) = self.at(&p.text_document_position)?;
        let found: Vec<Location> = a.references(file, at, p.context.include_declaration).into_iter().map(|s| location(&a, &paths, s)).collect();
        Ok(serde_json::to_value(found).expect("serialisable"))
    }

    fn hover(&self, p: TextDocumentPositionParams) -> Result<serde_json::Value, String> {
        let (a, _, file, at) = self.at(&p)?;
        let hover = a.hover(file, at).map(|(text, span)| Hover {
            contents: HoverContents::Markup(MarkupContent { kind: MarkupKind::Markdown, value: text }),
            range: Some(range(&a, span)),
        });
        Ok(serde_json::to_value(hover).expect("serialisable"))
    }

    fn completion(&self, p: TextDocumentPositionParams) -> Result<serde_json::Value, String> {
        let (a, _, file, at) = self.at(&p)?;
        let items: Vec<CompletionItem> = a
            .completions(file, at)
            .into_iter()
            .map(|c| CompletionItem {
                label: c.label,
                kind: Some(match c.kind {
                    CompletionKind::Relation => CompletionItemKind::STRUCT,
                    CompletionKind::Type => CompletionItemKind::TYPE_PARAMETER,
                    CompletionKind::Function => CompletionItemKind::FUNCTION,
                    CompletionKind::Keyword => CompletionItemKind::KEYWORD,
                }),
                detail: (!c.detail.is_empty()).then_some(c.detail),
                documentation: c.doc.map(|d| Documentation::MarkupContent(MarkupContent { kind: MarkupKind::Markdown, value: d })),
                ..Default::default()
            })
            .collect();
        Ok(serde_json::to_value(CompletionResponse::Array(items)).expect("serialisable"))
    }
}

fn publish(path: &Path, diagnostics: Vec<Diagnostic>) -> Notification {
    let params = PublishDiagnosticsParams { uri: path_to_uri(path), diagnostics, version: None };
    Notification::new(note::PublishDiagnostics::METHOD.to_string(), params)
}

fn range(a: &Analysis, span: Span) -> Range {
    let text = a.sources().text(span.file);
    Range { start: position(text, span.start), end: position(text, span.end) }
}

fn location(a: &Analysis, paths: &[PathBuf], span: Span) -> Location {
    Location { uri: path_to_uri(&paths[span.file]), range: range(a, span) }
}

/// The checker's diagnostic as the editor shows it: its message, then its
/// help, with its code; notes become related places.
fn to_lsp_diagnostic(a: &Analysis, paths: &[PathBuf], d: &ccattler_parser::Diagnostic) -> Diagnostic {
    let mut message = d.message.clone();
    if !d.help.is_empty() {
        message += &format!("\nhelp: {}", d.help);
    }
    let related: Vec<DiagnosticRelatedInformation> =
        d.notes.iter().map(|(span, text)| DiagnosticRelatedInformation { location: location(a, paths, *span), message: text.clone() }).collect();
    Diagnostic {
        range: range(a, d.span),
        severity: Some(match d.severity {
            Severity::Error => DiagnosticSeverity::ERROR,
            Severity::Warning => DiagnosticSeverity::WARNING,
        }),
        code: Some(NumberOrString::String(d.code.to_string())),
        source: Some("ccattler".into()),
        message,
        related_information: (!related.is_empty()).then_some(related),
        ..Default::default()
    }
}

/// `file:///a%20b/c.rules` → `/a b/c.rules`; other schemes → none.
pub fn uri_to_path(uri: &Uri) -> Option<PathBuf> {
    let rest = uri.as_str().strip_prefix("file://")?;
    // `file://host/path`: only the local host (empty or `localhost`).
    let path = rest.strip_prefix("localhost").unwrap_or(rest);
    if !path.starts_with('/') {
        return None;
    }
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    use std::os::unix::ffi::OsStringExt;
    Some(PathBuf::from(std::ffi::OsString::from_vec(out)))
}

/// A path as a `file://` URI, every byte outside the unreserved set and `/`
/// percent-encoded.
pub fn path_to_uri(path: &Path) -> Uri {
    use std::os::unix::ffi::OsStrExt;
    let mut s = String::from("file://");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            s.push(b as char);
        } else {
            s += &format!("%{b:02X}");
        }
    }
    Uri::from_str(&s).expect("a percent-encoded file URI is valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_and_paths_round_trip_with_odd_bytes() {
        for p in ["/a/b.rules", "/with space/ä ö.rules", "/per%cent/#hash?.rules"] {
            let uri = path_to_uri(Path::new(p));
            assert_eq!(uri_to_path(&uri).as_deref(), Some(Path::new(p)), "{}", uri.as_str());
        }
    }

    #[test]
    fn non_file_uris_are_not_paths() {
        assert_eq!(uri_to_path(&Uri::from_str("untitled:Untitled-1").unwrap()), None);
        assert_eq!(uri_to_path(&Uri::from_str("file://elsewhere/x.rules").unwrap()), None);
    }
}
