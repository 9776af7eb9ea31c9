// The dashboard works without JavaScript; with it, htmx polls and this marks the page so
// that what only JavaScript does (live updates) is said only then (docs/dashboard.md).
document.documentElement.classList.add("js");
