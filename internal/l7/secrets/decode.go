package secrets

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// A server may compress a response whether or not it was asked to, and
// compressed bytes hide a real value from the scrubber. So a scoped host's
// response is decoded before it is scrubbed and reaches the workload
// decoded; one that cannot be decoded does not reach it at all.

// UndecodableError is a response whose content coding corral cannot undo:
// unknown (br and zstd among them, for want of a decoder), or corrupt.
type UndecodableError struct {
	Encoding string
	Err      error
}

func (e *UndecodableError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("the response has content encoding %q, which corral cannot decode to remove masked secrets", e.Encoding)
	}
	return fmt.Sprintf("the response's %q content encoding could not be decoded: %v", e.Encoding, e.Err)
}

func (e *UndecodableError) Unwrap() error { return e.Err }

// DecodeResponse replaces resp.Body with its decoded content and removes
// Content-Encoding and Content-Length. The start of the stream is decoded
// here, so a response corrupt from its first bytes is an error before
// anything is sent on; corruption later surfaces as a read error, which
// ends the response without passing on what could not be decoded.
func DecodeResponse(resp *http.Response) error {
	var codings []string
	for _, v := range resp.Header.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	if len(codings) == 0 {
		resp.Header.Del("Content-Encoding")
		return nil
	}
	if !hasBody(resp) {
		resp.Header.Del("Content-Encoding")
		resp.Header.Del("Content-Length")
		return nil
	}
	body := resp.Body
	var r io.Reader = body
	// Codings are listed in the order they were applied.
	for i := len(codings) - 1; i >= 0; i-- {
		d, err := decoder(codings[i], r)
		if err != nil {
			body.Close()
			return err
		}
		r = d
	}
	br := bufio.NewReader(r)
	if _, err := br.Peek(1); err != nil && !errors.Is(err, io.EOF) {
		body.Close()
		return &UndecodableError{Encoding: strings.Join(codings, ", "), Err: err}
	}
	resp.Body = &decodedBody{Reader: br, body: body}
	resp.Header.Del("Content-Encoding")
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	resp.Uncompressed = true
	return nil
}

func hasBody(resp *http.Response) bool {
	if resp.Body == nil || resp.Body == http.NoBody || resp.ContentLength == 0 {
		return false
	}
	if resp.Request != nil && resp.Request.Method == http.MethodHead {
		return false
	}
	return resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusNotModified
}

func decoder(coding string, r io.Reader) (io.Reader, error) {
	switch coding {
	case "gzip", "x-gzip":
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, &UndecodableError{Encoding: coding, Err: err}
		}
		return z, nil
	case "deflate":
		// "deflate" is zlib (RFC 9110 section 8.4.1.2), but servers have
		// long sent raw deflate under that name; the zlib header tells.
		br := bufio.NewReader(r)
		if h, err := br.Peek(2); err == nil && (uint(h[0])<<8|uint(h[1]))%31 == 0 && h[0]&0x0f == 8 {
			z, err := zlib.NewReader(br)
			if err != nil {
				return nil, &UndecodableError{Encoding: coding, Err: err}
			}
			return z, nil
		}
		return flate.NewReader(br), nil
	}
	return nil, &UndecodableError{Encoding: coding}
}

type decodedBody struct {
	io.Reader
	body io.Closer
}

func (d *decodedBody) Close() error { return d.body.Close() }
