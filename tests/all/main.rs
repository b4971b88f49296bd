//! One integration test binary (faster to build than many), one module per
//! capability. Every test talks to real MCP servers over real transports.

#![allow(unsafe_code, reason = "tests signal the processes they start and read clock ticks: kill(2), sysconf(3)")]
#![allow(unreachable_pub, reason = "helpers shared between the test modules")]

#[path = "../support/fixture.rs"]
mod handler;

mod attack;
mod audit;
mod bench;
mod cache;
mod chatbot;
mod check;
mod cli;
mod cli_edges;
mod clients;
mod common;
mod docs;
mod edges;
mod faults;
mod first_run;
mod gate;
mod gemini;
mod hardening;
mod hosts;
mod hub;
mod hybrid;
mod inject;
mod jwt;
mod latency;
mod mcp_endpoint;
mod memory;
mod messages;
mod oauth;
mod oauth_time;
mod oauth_trust;
mod parse_cost;
mod per_user;
mod policy;
mod protocol;
mod relevance;
mod remote_config;
mod sdk;
mod security;
mod serve;
mod shared;
mod small_items;
mod terminal;
mod tools;
mod traces;
