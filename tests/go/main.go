// Command oncebus-go runs one scenario of the official Go SDK (azservicebus) against `oncebus serve`.
//
// Usage: oncebus-go <scenario> [argument]; built and run by tests/go/test_go_sdk.py, which starts the server and
// sets ONCEBUS_CONNECTION_STRING (the emulator-style string `oncebus serve` prints), SSL_CERT_FILE (the server's CA,
// which Go's crypto/x509 reads as its system pool: the admin client's HTTPS), and for the shared dedup scenarios
// ONCEBUS_SCENARIO_FILE and ONCEBUS_CLOCK_FILE.
//
// It prints one JSON line {"scenario", "ok", "result"} (or {"ok": false, "error"}) and exits 1 on failure.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	azlog "github.com/Azure/azure-sdk-for-go/sdk/azcore/log"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// result is what a scenario reports: a JSON object the Python test reads.
type result = map[string]any

var scenarios = map[string]func(ctx context.Context, arg string) (result, error){
	"dedup":         runDedupScenario,
	"send-receive":  sendReceive,
	"credit":        credit,
	"sessions":      sessions,
	"settle":        settle,
	"settle-modify": settleModify,
	"schedule":      schedule,
	"peek":          peek,
	"admin":         adminEntities,
	"admin-rules":   adminRules,
	"admin-errors":  adminErrors,
	"rights":        rights,
	"websocket":     webSocketRoundTrip,
}

func main() {
	if len(os.Args) < 2 {
		names := make([]string, 0, len(scenarios))
		for name := range scenarios {
			names = append(names, name)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "usage: oncebus-go <scenario> [argument]; scenarios: %s\n", strings.Join(names, ", "))
		os.Exit(2)
	}
	name, arg := os.Args[1], ""
	if len(os.Args) > 2 {
		arg = os.Args[2]
	}
	if os.Getenv("ONCEBUS_GO_LOG") != "" { // the SDK's own log on stderr (the test shows stderr when it fails)
		azlog.SetListener(func(event azlog.Event, message string) {
			fmt.Fprintf(os.Stderr, "%s [%s] %s\n", time.Now().Format("15:04:05.000"), event, message)
		})
	}
	scenario, ok := scenarios[name]
	if !ok {
		report(map[string]any{"scenario": name, "ok": false, "error": "no such scenario"})
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	got, err := scenario(ctx, arg)
	if err != nil {
		report(map[string]any{"scenario": name, "ok": false, "error": err.Error()})
		os.Exit(1)
	}
	report(map[string]any{"scenario": name, "ok": true, "result": got})
}

func report(line map[string]any) {
	encoded, err := json.Marshal(line)
	if err != nil {
		encoded, _ = json.Marshal(map[string]any{"ok": false, "error": "unencodable result: " + err.Error()})
	}
	fmt.Println(string(encoded))
}

// connection is the server's connection string; a restart (dedup.go) replaces it, the port changes.
var connection = os.Getenv("ONCEBUS_CONNECTION_STRING")

func connectionString() string {
	return connection
}

// retries: few and short, so that a refusal the SDK retries reaches the scenario in well under a second.
var retries = azservicebus.RetryOptions{MaxRetries: 2, RetryDelay: 50 * time.Millisecond, MaxRetryDelay: 200 * time.Millisecond}

func newClient() (*azservicebus.Client, error) {
	return azservicebus.NewClientFromConnectionString(connectionString(), &azservicebus.ClientOptions{RetryOptions: retries})
}

// errorText is what a failure says, with the SDK's code when it gives one (azservicebus.Error).
func errorText(err error) string {
	if err == nil {
		return ""
	}
	var sbErr *azservicebus.Error
	if errors.As(err, &sbErr) {
		return fmt.Sprintf("code=%s: %s", sbErr.Code, err.Error())
	}
	return err.Error()
}

func check(condition bool, format string, args ...any) error {
	if condition {
		return nil
	}
	return fmt.Errorf(format, args...)
}

// receiveFor receives until a receive that waits `wait` gets nothing, settling each message with settle.
func receiveFor(ctx context.Context, receiver *azservicebus.Receiver, wait time.Duration, settle func(*azservicebus.ReceivedMessage) error) ([]*azservicebus.ReceivedMessage, error) {
	var out []*azservicebus.ReceivedMessage
	for {
		waitCtx, cancel := context.WithTimeout(ctx, wait)
		// after a first message the SDK waits TimeAfterFirstMessage for more (1 s in receive-and-delete mode)
		batch, err := receiver.ReceiveMessages(waitCtx, 20, &azservicebus.ReceiveMessagesOptions{TimeAfterFirstMessage: 100 * time.Millisecond})
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return out, err
		}
		if len(batch) == 0 {
			return out, nil
		}
		for _, message := range batch {
			if settle != nil {
				if err := settle(message); err != nil {
					return out, err
				}
			}
			out = append(out, message)
		}
	}
}

func ids(messages []*azservicebus.ReceivedMessage) []string {
	out := make([]string, 0, len(messages))
	for _, message := range messages {
		out = append(out, message.MessageID)
	}
	return out
}

func ptr[T any](value T) *T {
	return &value
}
