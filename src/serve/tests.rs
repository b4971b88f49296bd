//! Tests of the proxy module (serve/mod.rs): connections and pseudonyms.

#[tokio::test]
async fn accepted_connections_do_not_wait_for_acknowledgements() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (conn, _) = listener.accept().await.unwrap();
    super::listen::nodelay(&conn);
    assert!(conn.nodelay().unwrap(), "TCP_NODELAY is off on an accepted connection");
}

#[test]
fn pseudonyms_are_stable_keyed_and_distinct() {
    let a = super::openai::pseudonym("k1-0123456789abcdef", "alice");
    assert_eq!(a, super::openai::pseudonym("k1-0123456789abcdef", "alice"));
    assert_ne!(a, super::openai::pseudonym("k2-0123456789abcdef", "alice"));
    assert_ne!(a, super::openai::pseudonym("k1-0123456789abcdef", "bob"));
    assert_eq!(a.len(), 64);
}

/// A proxy that cannot be built says why in the crate's one error type,
/// naming the setting to fix (and never the upstream's credentials).
#[tokio::test]
async fn a_proxy_with_an_unusable_upstream_is_a_serve_error() {
    let config = crate::Config::from_yaml("servers: {}\n", std::path::Path::new("/tmp/c.yaml")).unwrap();
    let ctx = std::sync::Arc::new(crate::McpContext::with_policy(&config, crate::Policy::allow_all()).await);
    for (upstream, says) in [
        ("ftp://user:s3cr3t@example.com/v1", "must start with http:// or https://"),
        ("https://example.com/v1#frag", "must not have a `#fragment`"),
    ] {
        let Err(e) = super::Proxy::new(ctx.clone(), &config, upstream) else { panic!("{upstream} was accepted") };
        assert!(matches!(e, crate::Error::Serve { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains(says) && !text.contains("s3cr3t"), "{text}");
    }
}
