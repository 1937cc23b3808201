// Command browse drives the system's headless Chromium through the DevTools
// protocol (chromedp), from inside a sandbox: it loads each URL given and
// prints what the page shows, then has the last page fetch() each URL given
// after -fetch (optionally after a method: "POST https://..."), printing
// what the page's script got, and has it send a message to each WebSocket
// URL given after -ws and print the echo.
//
//	browse [-fetch [METHOD ]URL]... [-ws URL]... URL...
//
// Output lines: "PAGE <url> <first line of the body text>" or "PAGE_ERR <url>
// <error>", "FETCH <method> <url> <status> <first line>" or "FETCH_ERR
// <method> <url> <error>", and "WS <url> ECHO <message>" or "WS_ERR <url>
// <error>".
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/chromedp/chromedp"
)

type urls []string

func (u *urls) String() string     { return strings.Join(*u, ",") }
func (u *urls) Set(s string) error { *u = append(*u, s); return nil }

func main() {
	var fetches, sockets urls
	flag.Var(&fetches, "fetch", "URL the page's script fetches (repeatable)")
	flag.Var(&sockets, "ws", "WebSocket URL the page's script sends a message to (repeatable)")
	flag.Parse()
	home, err := os.MkdirTemp("", "browse-")
	if err != nil {
		fmt.Println("SETUP_ERR", err)
		os.Exit(2)
	}
	defer os.RemoveAll(home)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath("/usr/bin/chromium"),
		chromedp.UserDataDir(filepath.Join(home, "profile")),
		// Chromium's own sandbox needs new user namespaces, which the
		// sandbox it runs in refuses.
		chromedp.NoSandbox,
		chromedp.DisableGPU,
	)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ctx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	ctx, cancelTab := chromedp.NewContext(ctx)
	defer cancelTab()
	for _, u := range flag.Args() {
		err := chromedp.Do(ctx, chromedp.Navigate(u))
		var text string
		if err == nil {
			text, err = chromedp.Run(ctx, chromedp.Evaluate[string]("document.body.innerText"))
		}
		if err != nil {
			fmt.Println("PAGE_ERR", u, err)
			continue
		}
		fmt.Println("PAGE", u, firstLine(text))
	}
	for _, u := range fetches {
		method := "GET"
		if m, rest, ok := strings.Cut(u, " "); ok {
			method, u = m, rest
		}
		js := fmt.Sprintf(`fetch(%q, {method: %q}).then(r => r.text().then(t => r.status + " " + t)).catch(e => "ERR " + e)`, u, method)
		report(ctx, "FETCH", method+" "+u, js)
	}
	for _, u := range sockets {
		js := fmt.Sprintf(`new Promise((done) => {
			const ws = new WebSocket(%q);
			const t = setTimeout(() => done("ERR timeout"), 10000);
			ws.onopen = () => ws.send("ping from chromium");
			ws.onmessage = (e) => { clearTimeout(t); ws.close(); done("ECHO " + e.data); };
			ws.onerror = () => { clearTimeout(t); done("ERR error"); };
		})`, u)
		report(ctx, "WS", u, js)
	}
}

// report runs the page script js, whose promise gives "ERR ..." on failure,
// and prints "KIND what <result>" or "KIND_ERR what <error>".
func report(ctx context.Context, kind, what, js string) {
	got, err := chromedp.Run(ctx, chromedp.Evaluate[string](js, chromedp.EvalAwaitPromise))
	switch {
	case err != nil:
		fmt.Println(kind+"_ERR", what, err)
	case strings.HasPrefix(got, "ERR "):
		fmt.Println(kind+"_ERR", what, got)
	default:
		fmt.Println(kind, what, firstLine(got))
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
