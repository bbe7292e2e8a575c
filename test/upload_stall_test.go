package test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
)

// TestStalledUploadIsCutAndItsConnectionClosed: an upload to /v1/files is
// bounded by its progress, not its length. One that stops sending gets a
// 408 at the body deadline and its connection is closed, so it cannot
// hold a --max-conns slot; one that keeps sending, slower than the whole
// deadline, is stored.
func TestStalledUploadIsCutAndItsConnectionClosed(t *testing.T) {
	const deadline = time.Second
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l70-gen-0"), NoBatcher: true,
		Gateway: gateway.Config{BodyTimeout: deadline}})
	addr := strings.TrimPrefix(st.GatewayURL(), "http://")

	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	_, _ = io.WriteString(fw, batchLines(3, "chat-large"))
	_ = mw.Close()
	body := form.Bytes()
	head := fmt.Sprintf("POST /v1/files HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n",
		addr, mw.FormDataContentType(), len(body))

	t.Run("stalled", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// Half the form, then nothing.
		if _, err := io.WriteString(c, head+string(body[:len(body)/2])); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_ = c.SetReadDeadline(time.Now().Add(deadline + 10*time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer to a stalled upload: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("stalled upload: %d, want 408", resp.StatusCode)
		}
		answered := time.Since(start)
		// The socket closes: a read ends in EOF or a reset, not the
		// client's own deadline.
		_, err = c.Read(make([]byte, 1))
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("the connection is still open %v after the 408", time.Since(start)-answered)
		}
		t.Logf("408 after %v, connection closed %v later", answered.Round(time.Millisecond), (time.Since(start) - answered).Round(time.Millisecond))
	})

	t.Run("slow but moving", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatal(err)
		}
		// Four pieces, each well within the deadline, together longer.
		step := (len(body) + 3) / 4
		pieces := [][]byte{body[:step], body[step : 2*step], body[2*step : 3*step], body[3*step:]}
		for i, piece := range pieces {
			if i > 0 {
				time.Sleep(deadline / 3) // the client's pace, not a wait for the gateway
			}
			if _, err := c.Write(piece); err != nil {
				t.Fatal(err)
			}
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"purpose":"batch"`) {
			t.Fatalf("slow upload: %d %s", resp.StatusCode, b)
		}
	})
}
