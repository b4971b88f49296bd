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
}

impl ApiError {
    pub(super) fn new(status: StatusCode, kind: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, kind, code, message: message.into() }
    }

    pub(super) fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", code, message)
    }

    pub(super) fn unauthorized(code: &'static str, message: &str) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", code, message)
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
        (self.status, axum::Json(body)).into_response()
    }
}
