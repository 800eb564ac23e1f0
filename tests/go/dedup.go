package main

// The shared duplicate-detection scenarios (tests/data/scenarios.json), the same list every layer's tests answer.
// The broker reads its time from ONCEBUS_CLOCK_FILE, which this program writes before each step, so the steps
// happen at their exact offsets; a restart step asks the Python test for one (a line on stdout) and reads the
// restarted server's connection string from stdin.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
)

type scenarioFields struct {
	MessageID    string  `json:"message_id"`
	SessionID    *string `json:"session_id"`
	PartitionKey *string `json:"partition_key"`
}

type scenarioStep struct {
	At              float64          `json:"at"`
	Send            *scenarioFields  `json:"send"`
	Batch           []scenarioFields `json:"batch"`
	Schedule        *scenarioFields  `json:"schedule"`
	EnqueueAfter    float64          `json:"enqueue_after"`
	SetWindow       string           `json:"set_window"`
	ReceiveComplete bool             `json:"receive_complete"`
	Restart         bool             `json:"restart"`
	Advance         bool             `json:"advance"`
	Error           bool             `json:"error"`
}

type scenario struct {
	Name  string         `json:"name"`
	Steps []scenarioStep `json:"steps"`
}

func loadScenario(name string) (*scenario, error) {
	raw, err := os.ReadFile(os.Getenv("ONCEBUS_SCENARIO_FILE"))
	if err != nil {
		return nil, err
	}
	var file struct {
		Scenarios []scenario `json:"scenarios"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		return nil, err
	}
	for i := range file.Scenarios {
		if file.Scenarios[i].Name == name {
			return &file.Scenarios[i], nil
		}
	}
	return nil, fmt.Errorf("no scenario %q in %s", name, os.Getenv("ONCEBUS_SCENARIO_FILE"))
}

// brokerClock is the file the broker reads its time from: integer microseconds since the epoch.
type brokerClock struct{ path string }

func (c brokerClock) now() (int64, error) {
	raw, err := os.ReadFile(c.path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
}

func (c brokerClock) set(us int64) error {
	temporary := c.path + ".go.tmp"
	if err := os.WriteFile(temporary, []byte(strconv.FormatInt(us, 10)), 0o644); err != nil {
		return err
	}
	return os.Rename(temporary, c.path)
}

func sdkMessage(fields scenarioFields) *azservicebus.Message {
	// the Go SDK sends a partition key that differs from the session id as it is given (the Python SDK refuses
	// to build such a message): the broker has to refuse it
	return &azservicebus.Message{
		Body: []byte("body"), MessageID: ptr(fields.MessageID), SessionID: fields.SessionID, PartitionKey: fields.PartitionKey,
	}
}

type scenarioRun struct {
	queue  string
	client *azservicebus.Client
	sender *azservicebus.Sender
	stdin  *bufio.Reader
}

func (r *scenarioRun) connect() error {
	client, err := newClient()
	if err != nil {
		return err
	}
	sender, err := client.NewSender(r.queue, nil)
	if err != nil {
		return err
	}
	r.client, r.sender = client, sender
	return nil
}

func (r *scenarioRun) close(ctx context.Context) {
	if r.client != nil {
		_ = r.client.Close(ctx)
	}
}

// restart asks the test to restart the server and takes the new connection string (its port changes).
func (r *scenarioRun) restart(ctx context.Context) error {
	r.close(ctx)
	fmt.Println(`{"restart": true}`)
	line, err := r.stdin.ReadString('\n')
	if err != nil {
		return fmt.Errorf("no connection string after the restart: %w", err)
	}
	connection = strings.TrimSpace(line)
	return r.connect()
}

func (r *scenarioRun) delivered(ctx context.Context, mode azservicebus.ReceiveMode) ([][2]any, error) {
	receiver, err := r.client.NewReceiverForQueue(r.queue, &azservicebus.ReceiverOptions{ReceiveMode: mode})
	if err != nil {
		return nil, err
	}
	defer receiver.Close(ctx)
	var settle func(*azservicebus.ReceivedMessage) error
	if mode == azservicebus.ReceiveModePeekLock {
		settle = func(message *azservicebus.ReceivedMessage) error { return receiver.CompleteMessage(ctx, message, nil) }
	}
	messages, err := receiveFor(ctx, receiver, time.Second, settle)
	if err != nil {
		return nil, err
	}
	out := [][2]any{}
	for _, message := range messages {
		var key any
		if message.PartitionKey != nil {
			key = *message.PartitionKey
		} else if message.SessionID != nil {
			key = *message.SessionID
		}
		out = append(out, [2]any{message.MessageID, key})
	}
	return out, nil
}

func runDedupScenario(ctx context.Context, name string) (result, error) {
	found, err := loadScenario(name)
	if err != nil {
		return nil, err
	}
	clock := brokerClock{os.Getenv("ONCEBUS_CLOCK_FILE")}
	now, err := clock.now()
	if err != nil {
		return nil, err
	}
	startUS := now + 1_000_000
	run := &scenarioRun{queue: strings.ReplaceAll(found.Name, "_", "-"), stdin: bufio.NewReader(os.Stdin)}
	if err := run.connect(); err != nil {
		return nil, err
	}
	defer func() { run.close(ctx) }()
	delivered := [][2]any{}
	refused := []string{}
	for _, step := range found.Steps {
		atUS := startUS + int64(step.At*1_000_000)
		if err := clock.set(atUS); err != nil {
			return nil, err
		}
		var sendErr error
		switch {
		case step.Restart:
			if err := run.restart(ctx); err != nil {
				return nil, err
			}
			continue
		case step.SetWindow != "":
			if err := setWindow(ctx, run.queue, step.SetWindow); err != nil {
				return nil, err
			}
			continue
		case step.ReceiveComplete:
			got, err := run.delivered(ctx, azservicebus.ReceiveModePeekLock)
			if err != nil {
				return nil, err
			}
			delivered = append(delivered, got...)
			continue
		case step.Advance:
			continue
		case step.Send != nil:
			sendErr = run.sender.SendMessage(ctx, sdkMessage(*step.Send), nil)
		case step.Batch != nil:
			batch, err := run.sender.NewMessageBatch(ctx, nil)
			if err != nil {
				return nil, err
			}
			for _, fields := range step.Batch {
				if err := batch.AddMessage(sdkMessage(fields), nil); err != nil {
					return nil, err
				}
			}
			sendErr = run.sender.SendMessageBatch(ctx, batch, nil)
		case step.Schedule != nil:
			when := time.UnixMicro(atUS).Add(time.Duration(step.EnqueueAfter * float64(time.Second)))
			_, sendErr = run.sender.ScheduleMessages(ctx, []*azservicebus.Message{sdkMessage(*step.Schedule)}, when, nil)
		}
		if step.Error {
			if sendErr == nil {
				return nil, fmt.Errorf("step at %v: the send was accepted; it must fail", step.At)
			}
			refused = append(refused, errorText(sendErr))
		} else if sendErr != nil {
			return nil, fmt.Errorf("step at %v: %s", step.At, errorText(sendErr))
		}
	}
	got, err := run.delivered(ctx, azservicebus.ReceiveModeReceiveAndDelete)
	if err != nil {
		return nil, err
	}
	return result{"delivered": append(delivered, got...), "refused": refused}, nil
}

// setWindow changes the queue's history window through the administration client (HTTPS to the same port).
func setWindow(ctx context.Context, queue string, window string) error {
	client, err := admin.NewClientFromConnectionString(connectionString(), nil)
	if err != nil {
		return err
	}
	got, err := client.GetQueue(ctx, queue, nil)
	if err != nil {
		return err
	}
	properties := got.QueueProperties
	properties.DuplicateDetectionHistoryTimeWindow = &window
	_, err = client.UpdateQueue(ctx, queue, properties, nil)
	return err
}
