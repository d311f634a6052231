// Package ui holds the fleet page's static files (plain HTML, CSS and
// JavaScript, no build step), embedded in the gateway binary and served
// at /ui/. The page reads the gateway's JSON API (/v1/fleet/..., and
// /v1/events and /v1/actions for a node's timeline) with the bearer token
// the user types once; the token is kept in the tab's sessionStorage.
package ui

import "embed"

// Files holds static/: index.html, app.js, style.css.
//
//go:embed static
var Files embed.FS
