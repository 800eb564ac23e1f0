package main

// Sending, receiving, credit, settlement, scheduling and peek, each on its own queue of the test's topology
// (tests/go/test_go_sdk.py).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

func withClient(ctx context.Context, body func(client *azservicebus.Client) (result, error)) (result, error) {
	client, err := newClient()
	if err != nil {
		return nil, err
	}
	defer client.Close(ctx)
	return body(client)
}

func send(ctx context.Context, client *azservicebus.Client, entity string, messages ...*azservicebus.Message) error {
	sender, err := client.NewSender(entity, nil)
	if err != nil {
		return err
	}
	defer sender.Close(ctx)
	for _, message := range messages {
		if err := sender.SendMessage(ctx, message, nil); err != nil {
			return err
		}
	}
	return nil
}

func plain(id string) *azservicebus.Message {
	return &azservicebus.Message{Body: []byte("body of " + id), MessageID: ptr(id)}
}

// receiveCount receives until it has n messages (each ReceiveMessages may return fewer than asked).
func receiveCount(ctx context.Context, receiver *azservicebus.Receiver, n int) ([]*azservicebus.ReceivedMessage, error) {
	var out []*azservicebus.ReceivedMessage
	for len(out) < n {
		batch, err := receiver.ReceiveMessages(ctx, n-len(out), nil)
		if err != nil {
			return out, fmt.Errorf("after %d of %d messages: %s", len(out), n, errorText(err))
		}
		out = append(out, batch...)
	}
	return out, nil
}

func sendReceive(ctx context.Context, _ string) (result, error) {
	return withClient(ctx, func(client *azservicebus.Client) (result, error) {
		enqueueTime := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
		first := &azservicebus.Message{
			Body: []byte("hello from go"), MessageID: ptr("sr-1"), Subject: ptr("greeting"),
			ContentType: ptr("text/plain"), CorrelationID: ptr("corr-1"), To: ptr("someone"), ReplyTo: ptr("go-reply"),
			TimeToLive: ptr(10 * time.Minute),
			ApplicationProperties: map[string]any{
				"text": "value", "number": int64(42), "small": int32(7), "flag": true, "ratio": 2.5, "when": enqueueTime,
			},
		}
		sender, err := client.NewSender("go-plain", nil)
		if err != nil {
			return nil, err
		}
		defer sender.Close(ctx)
		if err := sender.SendMessage(ctx, first, nil); err != nil {
			return nil, err
		}
		batch, err := sender.NewMessageBatch(ctx, nil)
		if err != nil {
			return nil, err
		}
		for _, id := range []string{"sr-2", "sr-3"} {
			if err := batch.AddMessage(plain(id), nil); err != nil {
				return nil, err
			}
		}
		if err := sender.SendMessageBatch(ctx, batch, nil); err != nil {
			return nil, err
		}
		receiver, err := client.NewReceiverForQueue("go-plain", nil)
		if err != nil {
			return nil, err
		}
		defer receiver.Close(ctx)
		got, err := receiveCount(ctx, receiver, 3)
		if err != nil {
			return nil, err
		}
		for _, message := range got {
			if err := receiver.CompleteMessage(ctx, message, nil); err != nil {
				return nil, fmt.Errorf("complete %s: %s", message.MessageID, errorText(err))
			}
		}
		left, err := receiveFor(ctx, receiver, time.Second, nil)
		if err != nil {
			return nil, err
		}
		m := got[0]
		types := map[string]string{}
		for key, value := range m.ApplicationProperties {
			types[key] = fmt.Sprintf("%T", value)
		}
		when, _ := m.ApplicationProperties["when"].(time.Time)
		sequences := []int64{}
		for _, message := range got {
			sequences = append(sequences, *message.SequenceNumber)
		}

		// a topic fans out to its subscription
		if err := send(ctx, client, "go-topic", plain("fan-1")); err != nil {
			return nil, err
		}
		subscription, err := client.NewReceiverForSubscription("go-topic", "all", nil)
		if err != nil {
			return nil, err
		}
		defer subscription.Close(ctx)
		fanned, err := receiveFor(ctx, subscription, time.Second, func(message *azservicebus.ReceivedMessage) error {
			return subscription.CompleteMessage(ctx, message, nil)
		})
		if err != nil {
			return nil, err
		}
		return result{
			"ids": ids(got), "left": ids(left), "body": string(m.Body), "subject": *m.Subject,
			"contentType": *m.ContentType, "correlationId": *m.CorrelationID, "to": *m.To, "replyTo": *m.ReplyTo,
			"ttlSeconds": m.TimeToLive.Seconds(), "deliveryCount": m.DeliveryCount, "state": int(m.State),
			"properties": m.ApplicationProperties, "propertyTypes": types, "whenRoundTrips": when.Equal(enqueueTime),
			"sequenceNumbers": sequences, "enqueuedTimeSet": m.EnqueuedTime != nil && !m.EnqueuedTime.IsZero(),
			"lockedUntilAfterEnqueued": m.LockedUntil != nil && m.EnqueuedTime != nil && m.LockedUntil.After(*m.EnqueuedTime),
			"expiresAt":                m.ExpiresAt != nil && m.ExpiresAt.Sub(*m.EnqueuedTime) == 10*time.Minute,
			"lockTokenSet":             m.LockToken != [16]byte{}, "fanned": ids(fanned),
		}, nil
	})
}

// credit: ReceiveMessages issues only the credit a call lacks, keeps the rest on the link between calls, and
// releases what arrives while no call is receiving (a release is not a delivery attempt).
func credit(ctx context.Context, _ string) (result, error) {
	return withClient(ctx, func(client *azservicebus.Client) (result, error) {
		sender, err := client.NewSender("go-credit", nil)
		if err != nil {
			return nil, err
		}
		defer sender.Close(ctx)
		for i := 1; i <= 7; i++ {
			if err := sender.SendMessage(ctx, plain(fmt.Sprintf("c-%d", i)), nil); err != nil {
				return nil, err
			}
		}
		receiver, err := client.NewReceiverForQueue("go-credit", nil)
		if err != nil {
			return nil, err
		}
		defer receiver.Close(ctx)
		calls := [][]string{}
		for _, count := range []int{2, 3, 5} {
			batch, err := receiver.ReceiveMessages(ctx, count, nil)
			if err != nil {
				return nil, err
			}
			for _, message := range batch {
				if err := receiver.CompleteMessage(ctx, message, nil); err != nil {
					return nil, err
				}
			}
			calls = append(calls, ids(batch))
		}
		// nothing there: the call returns when its context ends, with the context's error and no messages
		waitCtx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		started := time.Now()
		empty, emptyErr := receiver.ReceiveMessages(waitCtx, 4, nil)
		waited := time.Since(started)
		cancel()

		// sent while no call is receiving: the link still has credit, the SDK releases what comes in
		for i := 8; i <= 10; i++ {
			if err := sender.SendMessage(ctx, plain(fmt.Sprintf("c-%d", i)), nil); err != nil {
				return nil, err
			}
		}
		time.Sleep(500 * time.Millisecond)
		late, err := receiveCount(ctx, receiver, 3)
		if err != nil {
			return nil, err
		}
		counts := []uint32{}
		for _, message := range late {
			counts = append(counts, message.DeliveryCount)
			if err := receiver.CompleteMessage(ctx, message, nil); err != nil {
				return nil, err
			}
		}
		// a call for more than are there returns what there is (soon after the first, not at its deadline)
		for i := 11; i <= 12; i++ {
			if err := sender.SendMessage(ctx, plain(fmt.Sprintf("c-%d", i)), nil); err != nil {
				return nil, err
			}
		}
		manyCtx, cancelMany := context.WithTimeout(ctx, 10*time.Second)
		started = time.Now()
		many, err := receiver.ReceiveMessages(manyCtx, 100, nil)
		manyTook := time.Since(started)
		cancelMany()
		if err != nil {
			return nil, err
		}
		for _, message := range many {
			if err := receiver.CompleteMessage(ctx, message, nil); err != nil {
				return nil, err
			}
		}
		return result{
			"calls": calls, "empty": len(empty), "emptyError": fmt.Sprint(emptyErr),
			"emptyDeadline": errors.Is(emptyErr, context.DeadlineExceeded), "waitedMs": waited.Milliseconds(),
			"late": ids(late), "lateDeliveryCounts": counts, "many": ids(many), "manyMs": manyTook.Milliseconds(),
		}, nil
	})
}

func settle(ctx context.Context, _ string) (result, error) {
	return withClient(ctx, func(client *azservicebus.Client) (result, error) {
		const queue = "go-settle" // MaxDeliveryCount 3
		if err := send(ctx, client, queue, plain("abandoned"), plain("deferred"), plain("dead"), plain("renewed")); err != nil {
			return nil, err
		}
		receiver, err := client.NewReceiverForQueue(queue, nil)
		if err != nil {
			return nil, err
		}
		defer receiver.Close(ctx)
		out := result{}

		// abandon: the delivery count rises; past MaxDeliveryCount the message is dead-lettered
		counts := []uint32{}
		byID := map[string]*azservicebus.ReceivedMessage{}
		for attempt := 0; attempt < 3; attempt++ {
			got, err := receiveCount(ctx, receiver, 1)
			if err != nil {
				return nil, err
			}
			for len(got) > 0 && got[0].MessageID != "abandoned" {
				byID[got[0].MessageID] = got[0]
				if got, err = receiveCount(ctx, receiver, 1); err != nil {
					return nil, err
				}
			}
			counts = append(counts, got[0].DeliveryCount)
			if err := receiver.AbandonMessage(ctx, got[0], &azservicebus.AbandonMessageOptions{
				PropertiesToModify: map[string]any{"attempt": int64(attempt)},
			}); err != nil {
				return nil, fmt.Errorf("abandon: %s", errorText(err))
			}
		}
		out["abandonCounts"] = counts
		for len(byID) < 3 {
			got, err := receiveCount(ctx, receiver, 1)
			if err != nil {
				return nil, err
			}
			byID[got[0].MessageID] = got[0]
		}

		// defer, then receive it by sequence number and complete it (on the management link)
		deferred := byID["deferred"]
		if err := receiver.DeferMessage(ctx, deferred, nil); err != nil {
			return nil, fmt.Errorf("defer: %s", errorText(err))
		}
		again, err := receiver.ReceiveDeferredMessages(ctx, []int64{*deferred.SequenceNumber}, nil)
		if err != nil {
			return nil, fmt.Errorf("receive deferred: %s", errorText(err))
		}
		out["deferredReceived"] = ids(again)
		if len(again) == 1 {
			out["deferredState"] = int(again[0].State)
			out["deferredCompleteError"] = errorText(receiver.CompleteMessage(ctx, again[0], nil))
		}
		gone, err := receiver.ReceiveDeferredMessages(ctx, []int64{*deferred.SequenceNumber}, nil)
		out["deferredAfterComplete"] = ids(gone)
		out["deferredAfterCompleteError"] = errorText(err)

		// renew a lock: its locked-until moves on
		renewed := byID["renewed"]
		before := *renewed.LockedUntil
		time.Sleep(20 * time.Millisecond)
		out["renewError"] = errorText(receiver.RenewMessageLock(ctx, renewed, nil))
		out["renewMoved"] = renewed.LockedUntil.After(before)
		out["completeRenewed"] = errorText(receiver.CompleteMessage(ctx, renewed, nil))

		// dead-letter with a reason and a description
		if err := receiver.DeadLetterMessage(ctx, byID["dead"], &azservicebus.DeadLetterOptions{
			Reason: ptr("BadOrder"), ErrorDescription: ptr("the order has no lines"),
		}); err != nil {
			return nil, fmt.Errorf("dead-letter: %s", errorText(err))
		}
		deadLetters, err := client.NewReceiverForQueue(queue, &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
		if err != nil {
			return nil, err
		}
		defer deadLetters.Close(ctx)
		dead, err := receiveFor(ctx, deadLetters, time.Second, func(message *azservicebus.ReceivedMessage) error {
			return deadLetters.CompleteMessage(ctx, message, nil)
		})
		if err != nil {
			return nil, err
		}
		letters := []result{}
		for _, message := range dead {
			letter := result{"id": message.MessageID, "deliveryCount": message.DeliveryCount}
			if message.DeadLetterReason != nil {
				letter["reason"] = *message.DeadLetterReason
			}
			if message.DeadLetterErrorDescription != nil {
				letter["description"] = *message.DeadLetterErrorDescription
			}
			letters = append(letters, letter)
		}
		out["deadLettered"] = letters
		left, err := receiveFor(ctx, receiver, 500*time.Millisecond, nil)
		if err != nil {
			return nil, err
		}
		out["left"] = ids(left)
		return out, nil
	})
}

// settleModify: abandon, defer and dead-letter with PropertiesToModify (the SDK puts them in the modified
// outcome's message annotations, and in the rejected outcome's error info beside the dead-letter reason)
func settleModify(ctx context.Context, _ string) (result, error) {
	return withClient(ctx, func(client *azservicebus.Client) (result, error) {
		const queue = "go-modify"
		if err := send(ctx, client, queue, &azservicebus.Message{MessageID: ptr("m-abandon"), ApplicationProperties: map[string]any{"origin": "go"}}, plain("m-defer"), plain("m-dead")); err != nil {
			return nil, err
		}
		receiver, err := client.NewReceiverForQueue(queue, nil)
		if err != nil {
			return nil, err
		}
		defer receiver.Close(ctx)
		got, err := receiveCount(ctx, receiver, 3)
		if err != nil {
			return nil, err
		}
		out := result{}
		if err := receiver.AbandonMessage(ctx, got[0], &azservicebus.AbandonMessageOptions{
			PropertiesToModify: map[string]any{"note": "abandoned once", "attempt": int64(7)},
		}); err != nil {
			return nil, fmt.Errorf("abandon: %s", errorText(err))
		}
		again, err := receiveCount(ctx, receiver, 1)
		if err != nil {
			return nil, err
		}
		out["abandoned"] = again[0].ApplicationProperties
		if err := receiver.CompleteMessage(ctx, again[0], nil); err != nil {
			return nil, err
		}
		if err := receiver.DeferMessage(ctx, got[1], &azservicebus.DeferMessageOptions{
			PropertiesToModify: map[string]any{"deferredBy": "go"},
		}); err != nil {
			return nil, fmt.Errorf("defer: %s", errorText(err))
		}
		deferred, err := receiver.ReceiveDeferredMessages(ctx, []int64{*got[1].SequenceNumber}, nil)
		if err != nil || len(deferred) != 1 {
			return nil, fmt.Errorf("receive deferred: %d, %s", len(deferred), errorText(err))
		}
		out["deferred"] = deferred[0].ApplicationProperties
		if err := receiver.CompleteMessage(ctx, deferred[0], nil); err != nil {
			return nil, err
		}
		if err := receiver.DeadLetterMessage(ctx, got[2], &azservicebus.DeadLetterOptions{
			Reason: ptr("BadOrder"), PropertiesToModify: map[string]any{"deadBy": "go"},
		}); err != nil {
			return nil, fmt.Errorf("dead-letter: %s", errorText(err))
		}
		deadLetters, err := client.NewReceiverForQueue(queue, &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
		if err != nil {
			return nil, err
		}
		defer deadLetters.Close(ctx)
		dead, err := receiveCount(ctx, deadLetters, 1)
		if err != nil {
			return nil, err
		}
		out["deadLettered"] = dead[0].ApplicationProperties
		return out, deadLetters.CompleteMessage(ctx, dead[0], nil)
	})
}

func schedule(ctx context.Context, _ string) (result, error) {
	return withClient(ctx, func(client *azservicebus.Client) (result, error) {
		const queue = "go-sched"
		sender, err := client.NewSender(queue, nil)
		if err != nil {
			return nil, err
		}
		defer sender.Close(ctx)
		later := time.Now().Add(time.Hour)
		sequences, err := sender.ScheduleMessages(ctx, []*azservicebus.Message{plain("later-1"), plain("later-2")}, later, nil)
		if err != nil {
			return nil, fmt.Errorf("schedule: %s", errorText(err))
		}
		soon := time.Now().Add(1500 * time.Millisecond)
		soonSequences, err := sender.ScheduleMessages(ctx, []*azservicebus.Message{plain("soon")}, soon, nil)
		if err != nil {
			return nil, err
		}
		receiver, err := client.NewReceiverForQueue(queue, nil)
		if err != nil {
			return nil, err
		}
		defer receiver.Close(ctx)
		peeked, err := receiver.PeekMessages(ctx, 10, nil)
		if err != nil {
			return nil, fmt.Errorf("peek: %s", errorText(err))
		}
		states := map[string]int{}
		for _, message := range peeked {
			states[message.MessageID] = int(message.State)
		}
		cancelErr := sender.CancelScheduledMessages(ctx, sequences[:1], nil)
		waitCtx, cancel := context.WithTimeout(ctx, 6*time.Second)
		started := time.Now()
		got, err := receiver.ReceiveMessages(waitCtx, 1, nil)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("receive the scheduled message: %s", errorText(err))
		}
		arrivedAfter := time.Since(started)
		out := result{
			"sequenceNumbers": len(sequences), "distinct": sequences[0] != sequences[1], "peekedStates": states,
			"cancelError": errorText(cancelErr), "received": ids(got), "waitedMs": arrivedAfter.Milliseconds(),
			"soonSequence": soonSequences[0],
		}
		if len(got) == 1 {
			m := got[0]
			out["scheduledEnqueueTime"] = m.ScheduledEnqueueTime != nil && m.ScheduledEnqueueTime.Sub(soon).Abs() < time.Millisecond
			out["receivedSequence"] = *m.SequenceNumber
			out["completeError"] = errorText(receiver.CompleteMessage(ctx, m, nil))
		}
		after, err := receiver.PeekMessages(ctx, 10, &azservicebus.PeekMessagesOptions{FromSequenceNumber: ptr(int64(0))})
		if err != nil {
			return nil, err
		}
		out["leftPeeked"] = ids(after)
		return out, nil
	})
}

func peek(ctx context.Context, _ string) (result, error) {
	return withClient(ctx, func(client *azservicebus.Client) (result, error) {
		const queue = "go-peek"
		receiver, err := client.NewReceiverForQueue(queue, nil)
		if err != nil {
			return nil, err
		}
		defer receiver.Close(ctx)
		empty, err := receiver.PeekMessages(ctx, 5, nil)
		if err != nil {
			return nil, fmt.Errorf("peek on an empty queue: %s", errorText(err))
		}
		messages := []*azservicebus.Message{}
		for i := 1; i <= 5; i++ {
			messages = append(messages, plain(fmt.Sprintf("p-%d", i)))
		}
		if err := send(ctx, client, queue, messages...); err != nil {
			return nil, err
		}
		first, err := receiver.PeekMessages(ctx, 3, nil)
		if err != nil {
			return nil, err
		}
		next, err := receiver.PeekMessages(ctx, 3, nil)
		if err != nil {
			return nil, err
		}
		from, err := receiver.PeekMessages(ctx, 2, &azservicebus.PeekMessagesOptions{FromSequenceNumber: first[1].SequenceNumber})
		if err != nil {
			return nil, err
		}
		// peeking takes no lock: all five are received, each on its first delivery
		got, err := receiveCount(ctx, receiver, 5)
		if err != nil {
			return nil, err
		}
		counts := []uint32{}
		for _, message := range got {
			counts = append(counts, message.DeliveryCount)
		}
		// a locked message is still peeked (peek shows locked and active ones alike)
		lockedPeek, err := receiver.PeekMessages(ctx, 10, &azservicebus.PeekMessagesOptions{FromSequenceNumber: first[0].SequenceNumber})
		if err != nil {
			return nil, err
		}
		for _, message := range got {
			if err := receiver.CompleteMessage(ctx, message, nil); err != nil {
				return nil, err
			}
		}
		peekedCounts := []uint32{}
		for _, message := range first {
			peekedCounts = append(peekedCounts, message.DeliveryCount)
		}
		return result{
			"empty": len(empty), "first": ids(first), "next": ids(next), "from": ids(from), "received": ids(got),
			"deliveryCounts": counts, "lockedPeek": ids(lockedPeek), "peekedDeliveryCounts": peekedCounts,
			"peekedLockToken": first[0].LockToken != [16]byte{},
		}, nil
	})
}

// rights: a key with Listen only receives; its sends are refused (amqp:unauthorized-access, which the SDK does
// not retry: CodeUnauthorizedAccess)
func rights(ctx context.Context, _ string) (result, error) {
	listener, err := azservicebus.NewClientFromConnectionString(listenConnectionString(), &azservicebus.ClientOptions{RetryOptions: retries})
	if err != nil {
		return nil, err
	}
	defer listener.Close(ctx)
	out := result{}
	refused := send(ctx, listener, "go-plain", plain("not-sent"))
	var sbErr *azservicebus.Error
	out["sendRefused"] = errorText(refused)
	out["sendUnauthorized"] = errors.As(refused, &sbErr) && sbErr.Code == azservicebus.CodeUnauthorizedAccess
	root, err := newClient()
	if err != nil {
		return nil, err
	}
	defer root.Close(ctx)
	if err := send(ctx, root, "go-plain", plain("for-listener")); err != nil {
		return nil, err
	}
	receiver, err := listener.NewReceiverForQueue("go-plain", nil)
	if err != nil {
		return nil, err
	}
	defer receiver.Close(ctx)
	got, err := receiveFor(ctx, receiver, time.Second, func(message *azservicebus.ReceivedMessage) error {
		return receiver.CompleteMessage(ctx, message, nil)
	})
	if err != nil {
		return nil, err
	}
	out["received"] = ids(got)
	return out, nil
}
