package main

// Sessions on the queue go-sessions (RequiresSession): AcceptSessionForQueue, AcceptNextSessionForQueue, session
// state, the session lock, and listing sessions.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

func sessionMessage(id string, session string) *azservicebus.Message {
	return &azservicebus.Message{Body: []byte(id), MessageID: ptr(id), SessionID: ptr(session)}
}

func receiveSession(ctx context.Context, receiver *azservicebus.SessionReceiver, n int) ([]*azservicebus.ReceivedMessage, error) {
	var out []*azservicebus.ReceivedMessage
	for len(out) < n {
		batch, err := receiver.ReceiveMessages(ctx, n-len(out), nil)
		if err != nil {
			return out, err
		}
		for _, message := range batch {
			if err := receiver.CompleteMessage(ctx, message, nil); err != nil {
				return out, fmt.Errorf("complete %s: %s", message.MessageID, errorText(err))
			}
		}
		out = append(out, batch...)
	}
	return out, nil
}

func listSessions(ctx context.Context, client *azservicebus.Client, queue string) ([]string, error) {
	pager := client.NewListSessionsForQueuePager(queue, nil)
	out := []string{}
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return out, err
		}
		out = append(out, page.Sessions...)
	}
	sort.Strings(out)
	return out, nil
}

func sessions(ctx context.Context, _ string) (result, error) {
	return withClient(ctx, func(client *azservicebus.Client) (result, error) {
		const queue = "go-sessions"
		out := result{}
		// a message without a session id is refused by a queue that requires sessions; with the SDK's default
		// retry options (an error it retries would take about half a minute to come back), and a plain receiver
		noRetries, err := azservicebus.NewClientFromConnectionString(connectionString(), nil)
		if err != nil {
			return nil, err
		}
		started := time.Now()
		out["noSessionRefused"] = errorText(send(ctx, noRetries, queue, plain("no-session")))
		out["noSessionRefusedMs"] = time.Since(started).Milliseconds()
		started = time.Now()
		plainReceiver, err := noRetries.NewReceiverForQueue(queue, nil)
		if err != nil {
			return nil, err
		}
		_, plainErr := plainReceiver.ReceiveMessages(ctx, 1, nil)
		out["plainReceiverRefused"] = errorText(plainErr)
		out["plainReceiverRefusedMs"] = time.Since(started).Milliseconds()
		_ = noRetries.Close(ctx)
		if err := send(ctx, client, queue, sessionMessage("s1-a", "s1"), sessionMessage("s2-a", "s2"),
			sessionMessage("s1-b", "s1")); err != nil {
			return nil, err
		}
		listed, err := listSessions(ctx, client, queue)
		if err != nil {
			return nil, fmt.Errorf("list sessions: %s", errorText(err))
		}
		out["listed"] = listed

		s1, err := client.AcceptSessionForQueue(ctx, queue, "s1", nil)
		if err != nil {
			return nil, fmt.Errorf("accept s1: %s", errorText(err))
		}
		out["sessionId"] = s1.SessionID()
		lockedUntil := s1.LockedUntil()
		out["lockedUntilAhead"] = lockedUntil.After(time.Now())
		got, err := receiveSession(ctx, s1, 2)
		if err != nil {
			return nil, err
		}
		out["s1"] = ids(got)
		out["s1SessionIds"] = []string{*got[0].SessionID, *got[1].SessionID}
		emptyState, err := s1.GetSessionState(ctx, nil)
		if err != nil {
			return nil, fmt.Errorf("get session state: %s", errorText(err))
		}
		out["stateBefore"] = emptyState
		if err := s1.SetSessionState(ctx, []byte("step-2"), nil); err != nil {
			return nil, fmt.Errorf("set session state: %s", errorText(err))
		}
		state, err := s1.GetSessionState(ctx, nil)
		if err != nil {
			return nil, err
		}
		out["state"] = string(state)
		time.Sleep(20 * time.Millisecond)
		if err := s1.RenewSessionLock(ctx, nil); err != nil {
			return nil, fmt.Errorf("renew session lock: %s", errorText(err))
		}
		out["renewMoved"] = s1.LockedUntil().After(lockedUntil)

		// s1 is locked by s1: another accept of it is refused
		busyCtx, cancelBusy := context.WithTimeout(ctx, 5*time.Second)
		busy, busyErr := client.AcceptSessionForQueue(busyCtx, queue, "s1", nil)
		cancelBusy()
		if busy != nil {
			_ = busy.Close(ctx)
		}
		out["busy"] = errorText(busyErr)

		// the next session with messages is s2 (s1 is locked, and has none left)
		next, err := client.AcceptNextSessionForQueue(ctx, queue, nil)
		if err != nil {
			return nil, fmt.Errorf("accept next: %s", errorText(err))
		}
		out["next"] = next.SessionID()
		got, err = receiveSession(ctx, next, 1)
		if err != nil {
			return nil, err
		}
		out["s2"] = ids(got)
		if err := next.Close(ctx); err != nil {
			return nil, err
		}
		if err := s1.Close(ctx); err != nil {
			return nil, err
		}

		// the state outlives the lock; a session with state and no messages is still listed
		listed, err = listSessions(ctx, client, queue)
		if err != nil {
			return nil, err
		}
		out["listedAfter"] = listed
		again, err := client.AcceptSessionForQueue(ctx, queue, "s1", nil)
		if err != nil {
			return nil, fmt.Errorf("accept s1 again: %s", errorText(err))
		}
		state, err = again.GetSessionState(ctx, nil)
		if err != nil {
			return nil, err
		}
		out["stateAgain"] = string(state)
		if err := again.SetSessionState(ctx, nil, nil); err != nil {
			return nil, fmt.Errorf("clear session state: %s", errorText(err))
		}
		cleared, err := again.GetSessionState(ctx, nil)
		if err != nil {
			return nil, err
		}
		// the SDK sends a nil state as an empty binary (the .NET and Python SDKs send null): it reads back empty
		out["clearedLength"] = len(cleared)
		// nothing in the session: a receive returns when its context ends
		waitCtx, cancelWait := context.WithTimeout(ctx, time.Second)
		nothing, nothingErr := again.ReceiveMessages(waitCtx, 5, nil)
		cancelWait()
		out["emptySession"] = len(nothing)
		out["emptySessionDeadline"] = errors.Is(nothingErr, context.DeadlineExceeded)
		if err := again.Close(ctx); err != nil {
			return nil, err
		}

		// no session has messages: AcceptNextSessionForQueue fails with CodeTimeout by the context's deadline
		noneCtx, cancelNone := context.WithTimeout(ctx, 3*time.Second)
		started = time.Now()
		none, noneErr := client.AcceptNextSessionForQueue(noneCtx, queue, nil)
		cancelNone()
		out["noneWaitedMs"] = time.Since(started).Milliseconds()
		if none != nil {
			out["noneSession"] = none.SessionID()
			_ = none.Close(ctx)
		}
		out["none"] = errorText(noneErr)
		var sbErr *azservicebus.Error
		out["noneTimeout"] = errors.As(noneErr, &sbErr) && sbErr.Code == azservicebus.CodeTimeout
		return out, nil
	})
}
