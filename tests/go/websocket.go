package main

// AMQP over WebSockets: ClientOptions.NewWebSocketConn with github.com/coder/websocket, as the SDK's own example
// (example_websockets_and_proxies_test.go) does it. The SDK hands the function wss://<endpoint host:port>/$servicebus/
// websocket; oncebus's main port takes TLS, trusted through SSL_CERT_FILE.

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/coder/websocket"
)

// webSocketClient is a client whose every connection is a WebSocket; dialed records the URLs it was given.
func webSocketClient() (*azservicebus.Client, func() []string, error) {
	var mu sync.Mutex
	var dialed []string
	newWebSocketConn := func(ctx context.Context, args azservicebus.NewWebSocketConnArgs) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, args.Host)
		mu.Unlock()
		opts := &websocket.DialOptions{Subprotocols: []string{"amqp"}}
		wssConn, _, err := websocket.Dial(ctx, args.Host, opts)
		if err != nil {
			return nil, err
		}
		return websocket.NetConn(ctx, wssConn, websocket.MessageBinary), nil
	}
	client, err := azservicebus.NewClientFromConnectionString(connectionString(), &azservicebus.ClientOptions{
		RetryOptions: retries, NewWebSocketConn: newWebSocketConn,
	})
	urls := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), dialed...)
	}
	return client, urls, err
}

func webSocketRoundTrip(ctx context.Context, _ string) (result, error) {
	client, dialed, err := webSocketClient()
	if err != nil {
		return nil, err
	}
	defer client.Close(ctx)
	out := result{}

	// send, a duplicate resend (dropped), a batch, a 200 KiB message; receive and complete
	const queue = "go-ws"
	large := bytes.Repeat([]byte("x"), 200*1024)
	if err := send(ctx, client, queue, plain("ws-1"), plain("ws-1")); err != nil {
		return nil, fmt.Errorf("send: %s", errorText(err))
	}
	sender, err := client.NewSender(queue, nil)
	if err != nil {
		return nil, err
	}
	batch, err := sender.NewMessageBatch(ctx, nil)
	if err != nil {
		return nil, err
	}
	for _, id := range []string{"ws-2", "ws-3"} {
		if err := batch.AddMessage(plain(id), nil); err != nil {
			return nil, err
		}
	}
	if err := sender.SendMessageBatch(ctx, batch, nil); err != nil {
		return nil, fmt.Errorf("send batch: %s", errorText(err))
	}
	if err := sender.SendMessage(ctx, &azservicebus.Message{Body: large, MessageID: ptr("ws-large")}, nil); err != nil {
		return nil, fmt.Errorf("send large: %s", errorText(err))
	}
	_ = sender.Close(ctx)
	receiver, err := client.NewReceiverForQueue(queue, nil)
	if err != nil {
		return nil, err
	}
	got, err := receiveFor(ctx, receiver, 2*time.Second, func(m *azservicebus.ReceivedMessage) error {
		return receiver.CompleteMessage(ctx, m, nil)
	})
	if err != nil {
		return nil, fmt.Errorf("receive: %s", errorText(err))
	}
	received := []string{}
	for _, m := range got {
		received = append(received, fmt.Sprintf("%s (%d bytes)", m.MessageID, len(m.Body)))
	}
	sort.Strings(received)
	out["received"] = received
	left, err := receiveFor(ctx, receiver, time.Second, nil)
	if err != nil {
		return nil, err
	}
	out["left"] = len(left)
	_ = receiver.Close(ctx)

	// a session: accepted by name, its messages in order, its state set and read back
	const sessionQueue = "go-ws-sessions"
	if err := send(ctx, client, sessionQueue, sessionMessage("a-1", "ws-s"), sessionMessage("a-2", "ws-s")); err != nil {
		return nil, fmt.Errorf("send to the session: %s", errorText(err))
	}
	session, err := client.AcceptSessionForQueue(ctx, sessionQueue, "ws-s", nil)
	if err != nil {
		return nil, fmt.Errorf("accept session: %s", errorText(err))
	}
	inSession, err := receiveSession(ctx, session, 2)
	if err != nil {
		return nil, err
	}
	out["session"] = ids(inSession)
	out["sessionId"] = session.SessionID()
	if err := session.SetSessionState(ctx, []byte("ws-state"), nil); err != nil {
		return nil, fmt.Errorf("set state: %s", errorText(err))
	}
	state, err := session.GetSessionState(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("get state: %s", errorText(err))
	}
	out["state"] = string(state)
	_ = session.Close(ctx)
	out["dialed"] = dialed()
	return out, nil
}
