//! Our own errors, in OpenAI's shape (`{"error": {"message", "type",
//! "param", "code"}}`) so that every OpenAI client shows them as it shows the
//! API's. Errors the upstream returns are relayed as they are, never rewritten.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An error the proxy itself answers with.
#[derive(Debug)]
pub(super) struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// OpenAI's `type`.
    pub kind: &'static str,
    /// OpenAI's `code`.
    pub code: &'static str,
    /// What happened and what to do.
    pub message: String,
    /// A `WWW-Authenticate` challenge to send with a 401.
    pub challenge: Option<String>,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, kind: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, kind, code, message: message.into(), challenge: None }
    }

    pub(super) fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", code, message)
    }

    pub(super) fn unauthorized(code: &'static str, message: &str) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", code, message)
    }

    /// A refused bearer token (RFC 6750 section 3): 401 with
    /// `WWW-Authenticate: Bearer error="invalid_token", error_description="..."`.
    pub(super) fn invalid_token(description: &str) -> Self {
        let quoted: String =
            description.chars().filter(|c| *c != '"' && *c != '\\' && c.is_ascii_graphic() || *c == ' ').collect();
        Self {
            challenge: Some(format!("Bearer error=\"invalid_token\", error_description=\"{quoted}\"")),
            ..Self::unauthorized("invalid_token", &format!("The bearer token is refused: {description}"))
        }
    }

    pub(super) fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            format!("The request body is larger than this proxy accepts (serve.max_body_bytes = {limit} bytes)"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": {"message": self.message, "type": self.kind, "param": null, "code": self.code}
        });
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(v) = self.challenge.and_then(|c| axum::http::HeaderValue::from_str(&c).ok()) {
            response.headers_mut().insert(axum::http::header::WWW_AUTHENTICATE, v);
        }
        response
    }
}
